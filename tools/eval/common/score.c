/*
 * score.c — what the programs score with: one prediction against the
 * reference's (KL, top-1, NLL increase), and the selections of the two
 * in-process bounds, KVzip's one top-k over every list and the hindsight
 * oracle's per-list top-k.  Contracts in eval.h.
 */
#include "eval.h"

#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "model.h"
#include "replay.h"

void score_compare(const float *rf, const float *lg, uint32_t V, int32_t y,
                 double *kl_out, int *top1_out, double *dnll_out)
{
	double mf = rf[0], me = lg[0];
	uint32_t af = 0, ae = 0;
	for (uint32_t v = 1; v < V; v++) {
		if (rf[v] > mf) {
			mf = rf[v];
			af = v;
		}
		if (lg[v] > me) {
			me = lg[v];
			ae = v;
		}
	}
	double zf = 0, ze = 0;
	for (uint32_t v = 0; v < V; v++) {
		zf += exp(rf[v] - mf);
		ze += exp(lg[v] - me);
	}
	double lzf = mf + log(zf), lze = me + log(ze), kl = 0;
	for (uint32_t v = 0; v < V; v++) {
		double lpf = rf[v] - lzf, lpe = lg[v] - lze;
		kl += exp(lpf) * (lpf - lpe);
	}
	*kl_out = kl > 0 ? kl : 0;
	*top1_out = af == ae;
	*dnll_out = (lze - lg[y]) - (lzf - rf[y]);
}

int score_oracle_evict(const struct model *M, struct replay *r, double R,
                       uint32_t tokens, const float *s, size_t sl,
                       size_t sh)
{
	const struct model_config *mc = &M->cfg;
	uint32_t n = replay_pos(r);
	uint32_t B = tokens ? (tokens < n ? tokens : n)
	                    : n - (uint32_t)floor(R * n);
	float *sc = malloc(sizeof(float) * n);
	uint32_t *rank = malloc(sizeof(uint32_t) * n),
	         *idx = malloc(sizeof(uint32_t) * n),
	         *scr = malloc(sizeof(uint32_t) * n);
	uint8_t *drop = malloc(n);
	if (!sc || !rank || !idx || !scr || !drop) {
		free(sc);
		free(rank);
		free(idx);
		free(scr);
		free(drop);
		return KVT_ENOMEM;
	}
	for (uint32_t l = 0; l < mc->n_layers; l++)
		for (uint32_t g = 0; g < mc->n_kv_heads; g++) {
			uint8_t *al = replay_alive(r, l, g);
			uint32_t G = mc->n_heads / mc->n_kv_heads;
			uint32_t k = 0;
			for (uint32_t i = 0; i < n; i++)
				if (al[i]) {
					/* best head of the group */
					float best = 0;
					for (uint32_t h = g * G; h < (g + 1) * G;
					     h++) {
						float v = s ? s[l * sl + h * sh + i]
						            : 0;
						best = v > best ? v : best;
					}
					sc[k] = best;
					rank[k] = i;
					idx[k++] = i;
				}
			if (k <= B)
				continue;
			select_topk_cpu(sc, rank, NULL, k, B, drop, scr);
			for (uint32_t e = 0; e < k; e++)
				if (drop[e])
					al[idx[e]] = 0;
		}
	free(sc);
	free(rank);
	free(idx);
	free(scr);
	free(drop);
	return 0;
}

int score_kvzip_drop(const float *scores, uint32_t nl, uint32_t P, double R,
                   uint8_t *drop)
{
	size_t n = (size_t)nl * P;
	float *s = malloc(sizeof(float) * n);
	uint32_t *rank = malloc(sizeof(uint32_t) * n),
	         *sc = malloc(sizeof(uint32_t) * n);
	uint8_t *prot = malloc(n);
	int rc = KVT_ENOMEM;
	if (!s || !rank || !sc || !prot)
		goto out;
	uint64_t np = 0;
	for (size_t e = 0; e < n; e++) {
		uint32_t i = (uint32_t)(e % P);
		s[e] = scores[e];
		rank[e] = i;
		prot[e] = i < KVZIP_SINKS;
		np += prot[e];
	}
	uint64_t B = (uint64_t)(P - (uint32_t)floor(R * P)) * nl;
	uint32_t k = B > np ? (uint32_t)(B - np) : 0;
	select_topk_cpu(s, rank, prot, (uint32_t)n, k, drop, sc);
	rc = 0;
out:
	free(s);
	free(rank);
	free(sc);
	free(prot);
	return rc;
}
