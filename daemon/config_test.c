/* config_test.c — the config table: sizes, bounds, files, enumerations. */
#include <stdio.h>

#include "config.h"
#include "test.h"

TEST(config, defaults_are_documented_values)
{
	struct config c;
	config_defaults(&c);
	T_EQ_U64(c.pool_size, 256ull << 20);
	T_EQ_U64(c.default_quota, 0);
	T_EQ(c.expected_tenants, 4);
	T_EQ_U64(c.tenant_memory_max, 1ull << 30);
	T_EQ(c.max_tenants, 64);
	T_EQ(c.contexts, 256);
	T_EQ_STR(c.backend, "auto");
	T_EQ_STR(c.log_level, "notice");
	T_EQ_STR(c.runtime_dir, "");
	char err[128];
	T_OK(config_validate(&c, err, sizeof(err)));
}

TEST(config, sizes_parse_with_suffixes)
{
	uint64_t v;
	T_EQ(config_parse_size("0", &v), 0);
	T_EQ_U64(v, 0);
	T_EQ(config_parse_size("2M", &v), 0);
	T_EQ_U64(v, 2097152);
	T_EQ(config_parse_size("3G", &v), 0);
	T_EQ_U64(v, 3221225472ull);
	T_EQ(config_parse_size("4KiB", &v), 0);
	T_EQ_U64(v, 4096);
	T_EQ(config_parse_size("1MB", &v), 0);
	T_EQ_U64(v, 1048576);
	T_EQ(config_parse_size("", &v), -1);
	T_EQ(config_parse_size("-1", &v), -1);
	T_EQ(config_parse_size("12Q", &v), -1);
	T_EQ(config_parse_size("1Mx", &v), -1);
	T_EQ(config_parse_size("99999999999999999999", &v), -1);
	T_EQ(config_parse_size("20000000000T", &v), -1);
}

TEST(config, set_refuses_bad_values_and_keeps_old)
{
	struct config c;
	char err[256];
	config_defaults(&c);
	T_ERR(config_set(&c, "pool_size", "1K", err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "pool_size"));
	T_EQ_U64(c.pool_size, 256ull << 20);
	T_ERR(config_set(&c, "backend", "tpu", err, sizeof(err)), KVT_EINVAL);
	T_EQ_STR(c.backend, "auto");
	T_ERR(config_set(&c, "max_tenants", "0", err, sizeof(err)), KVT_EINVAL);
	T_ERR(config_set(&c, "max_tenants", "12abc", err, sizeof(err)),
	      KVT_EINVAL);
	T_ERR(config_set(&c, "nope", "1", err, sizeof(err)), KVT_EINVAL);
	T_ERR(config_set(&c, "log_level", "loud", err, sizeof(err)), KVT_EINVAL);
	T_OK(config_set(&c, "log_level", "debug", err, sizeof(err)));
	T_EQ_STR(c.log_level, "debug");
	T_OK(config_set(&c, "pool_size", "6M", err, sizeof(err)));
	T_EQ_U64(c.pool_size, 6ull << 20);
	T_OK(config_set(&c, "pool_size", "5M", err, sizeof(err)));
	T_ERR(config_validate(&c, err, sizeof(err)), KVT_EINVAL);
}

TEST(config, file_applies_all_or_nothing)
{
	struct config c;
	char err[256], path[512];
	config_defaults(&c);
	snprintf(path, sizeof(path), "%s/good.conf", th_tmpdir());
	FILE *f = fopen(path, "w");
	fprintf(f, "# comment\n\n  pool_size = 8M \nmax_tenants=3\n"
	           "runtime_dir = /tmp/x y\n");
	fclose(f);
	T_OK(config_load_file(&c, path, err, sizeof(err)));
	T_EQ_U64(c.pool_size, 8ull << 20);
	T_EQ(c.max_tenants, 3);
	T_EQ_STR(c.runtime_dir, "/tmp/x y");

	snprintf(path, sizeof(path), "%s/bad.conf", th_tmpdir());
	f = fopen(path, "w");
	fprintf(f, "pool_size = 16M\nmax_tenants 4\n");
	fclose(f);
	T_ERR(config_load_file(&c, path, err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, ":2:"));
	T_EQ_U64(c.pool_size, 8ull << 20); /* line 1 was not applied */
	T_ERR(config_load_file(&c, "/nonexistent/kvtrimd.conf", err,
	                       sizeof(err)), KVT_ESYS);
}
