/*
 * fiber.cc — kernel launches of the CUDA emulator (see emu.h and
 * docs/cuda.md, "CPU emulation of the kernels").
 *
 * A launch runs its blocks one after another on the calling thread.  The
 * threads of a block are fibers, each on its own mmap'd stack with a guard
 * page, and a fiber runs until it reaches a barrier or returns; it then
 * hands the CPU straight to the next runnable fiber in thread order (no
 * scheduler in between).  A thread that returns hands its stack to the
 * next one when that one has not run yet, which then runs on it without
 * a switch (the order is the same; stacks are prepared when first used).  The last thread to reach a barrier releases the
 * others and carries on.  So __syncthreads and the warp intrinsics are real
 * rendezvous, a missing barrier shows up as a wrong result (thread 0 runs
 * ahead of thread 1), and when no fiber can run the block is stuck: that is
 * reported with every waiting thread's barrier and source line, and the
 * launch fails (cudaErrorLaunchFailure, sticky) instead of hanging.
 *
 * Switching is a few instructions of assembly on x86-64 (ucontext, which
 * makes a system call per switch, elsewhere or with -DKVT_EMU_UCONTEXT):
 * warp shuffles switch 32 times each, and the paged-attention tests do
 * millions.  ASan and TSan are told about every switch, or they would see
 * one thread jumping between stacks.
 *
 * Environment: KVT_EMU_ORDER=reverse runs the runnable fibers in reverse
 * thread order, which turns up races the forward order hides;
 * KVT_EMU_STACK_KB sets the fiber stack size (default 64, 256 under ASan).
 */
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "emu.h"
#include "internal.h"

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif
#ifdef __SANITIZE_THREAD__
#include <sanitizer/tsan_interface.h>
#define EMU_TSAN 1
#endif

#if defined(__x86_64__) && !defined(KVT_EMU_UCONTEXT)
#define EMU_ASM 1
#else
#include <ucontext.h>
#endif

#ifdef EMU_ASM
/*
 * kvt_emu_ctx_switch(save, load): pushes the callee-saved registers and the
 * SSE/x87 control words on the current stack, stores the stack pointer in
 * *save, loads load and pops the same from there.  A new fiber's stack is
 * prepared (fiber_prepare) so that the pops end in kvt_emu_fiber_start with
 * the fiber in r12 and its main function in r13.
 */
__asm__(".text\n"
        ".globl kvt_emu_ctx_switch\n"
        ".hidden kvt_emu_ctx_switch\n"
        ".type kvt_emu_ctx_switch,@function\n"
        "kvt_emu_ctx_switch:\n"
        "	pushq %rbp\n"
        "	pushq %rbx\n"
        "	pushq %r12\n"
        "	pushq %r13\n"
        "	pushq %r14\n"
        "	pushq %r15\n"
        "	subq $8, %rsp\n"
        "	stmxcsr (%rsp)\n"
        "	fnstcw 4(%rsp)\n"
        "	movq %rsp, (%rdi)\n"
        "	movq %rsi, %rsp\n"
        "	ldmxcsr (%rsp)\n"
        "	fldcw 4(%rsp)\n"
        "	addq $8, %rsp\n"
        "	popq %r15\n"
        "	popq %r14\n"
        "	popq %r13\n"
        "	popq %r12\n"
        "	popq %rbx\n"
        "	popq %rbp\n"
        "	ret\n"
        ".size kvt_emu_ctx_switch, .-kvt_emu_ctx_switch\n"
        ".globl kvt_emu_fiber_start\n"
        ".hidden kvt_emu_fiber_start\n"
        ".type kvt_emu_fiber_start,@function\n"
        "kvt_emu_fiber_start:\n"
        "	.cfi_startproc\n"
        "	.cfi_undefined rip\n" /* backtraces end here */
        "	movq %r12, %rdi\n"
        "	call *%r13\n"
        "	ud2\n"
        "	.cfi_endproc\n"
        ".size kvt_emu_fiber_start, .-kvt_emu_fiber_start\n");
extern "C" void kvt_emu_ctx_switch(void **save, void *load);
extern "C" void kvt_emu_fiber_start(void);
#endif

namespace kvt_emu {

thread_regs *cur;
uint3 block_idx;
dim3 block_dim, grid_dim;

namespace {

enum { F_READY, F_BAR, F_WARP, F_DONE };

const char *const OP_NAME[] = {"__syncwarp",      "__shfl_sync",
                               "__shfl_up_sync",  "__shfl_down_sync",
                               "__shfl_xor_sync", "__ballot_sync",
                               "__any_sync",      "__all_sync"};

struct fiber {
	thread_regs regs; /* first: cur points here */
	int idx;          /* linear thread index in the block */
	int state;
	const char *file; /* the barrier it waits at */
	int line;
	int op, arg, width; /* its warp op */
	unsigned mask;
	uint64_t in, out; /* exchange slot: own value, result */
	char *stack;      /* [stack_bytes], a guard page below */
	bool dirty;       /* abandoned mid-kernel: ASan poison left behind */
	bool started;     /* has run in this block (its stack prepared) */
#ifdef EMU_ASM
	void *sp;
#else
	ucontext_t uc;
#endif
#ifdef EMU_ASAN
	void *fake;
#endif
#ifdef EMU_TSAN
	void *tsan;
#endif
};

/* Lanes of one warp that wait in one op.  A warp has a list: lanes with
 * other masks may wait in other ops meanwhile (the two sides of a branch,
 * or lanes gone on to a full-warp op while the rest of the warp finishes a
 * half-warp one).  Whether those waits can all complete is the deadlock
 * check's business. */
struct warp_wait {
	unsigned waiting; /* lanes arrived */
	unsigned mask;    /* of the op they wait in */
	int op;
	const char *file;
	int line;
};

struct bounds_entry {
	std::string file, name; /* basename of the .cu, kernel identifier */
	long max_threads;
};

std::vector<fiber> fibers;    /* one per thread of the largest block */
std::vector<std::vector<warp_wait>> warps; /* per warp of the block */
fiber *running;               /* the fiber on the CPU, NULL: the host */
int n_threads, n_done, n_bar; /* threads of the block, exited, at bar */
const char *bar_file;         /* where the n_bar threads wait */
int bar_line;
bool failed;
std::string fail_msg;
const launch_desc *L;
void *dyn_buf;
size_t stack_bytes;
size_t page_bytes;
bool reverse;
#ifdef EMU_ASM
unsigned mxcsr_cw[2]; /* the host's, for new fibers */
#endif
char *shared_tls;   /* the launching thread's block of the emulator's */
size_t shared_size; /* object: the __shared__ variables outside ASan */
#ifdef EMU_ASM
void *host_sp;
#else
ucontext_t host_uc;
#endif
#ifdef EMU_ASAN
void *host_fake;
const void *host_bottom;
size_t host_size;
#endif
#ifdef EMU_TSAN
void *host_tsan;
#endif

std::vector<bounds_entry> &bounds(void)
{
	static std::vector<bounds_entry> v; /* filled before main */
	return v;
}

const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}

[[noreturn]] void fatal(const char *what)
{
	note("%s", what);
	abort();
}

/* ------------------------------------------------------------- fibers */

void fiber_main(fiber *f);

void fiber_prepare(fiber *f)
{
#ifdef EMU_ASAN
	/* A fiber that ran to the end left the frames of its last switch
	 * poisoned at the top of the stack (they never returned); one
	 * abandoned mid-kernel may have left poison anywhere. */
	size_t used = f->dirty || stack_bytes < 16384 ? stack_bytes : 16384;
	ASAN_UNPOISON_MEMORY_REGION(f->stack + stack_bytes - used, used);
#endif
	f->dirty = false;
#ifdef EMU_ASM
	uintptr_t top = ((uintptr_t)f->stack + stack_bytes) & ~(uintptr_t)15;
	uint64_t *sp = (uint64_t *)(top - 16);
	*--sp = (uint64_t)(uintptr_t)&kvt_emu_fiber_start; /* ret */
	*--sp = 0;                                          /* rbp */
	*--sp = 0;                                          /* rbx */
	*--sp = (uint64_t)(uintptr_t)f;                     /* r12 */
	*--sp = (uint64_t)(uintptr_t)&fiber_main;           /* r13 */
	*--sp = 0;                                          /* r14 */
	*--sp = 0;                                          /* r15 */
	*--sp = (uint64_t)mxcsr_cw[0] | (uint64_t)mxcsr_cw[1] << 32;
	f->sp = sp;
#else
	struct entry {
		static void go(unsigned hi, unsigned lo)
		{
			fiber_main((fiber *)((uintptr_t)hi << 32 | lo));
		}
	};
	uintptr_t p = (uintptr_t)f;
	getcontext(&f->uc);
	f->uc.uc_stack.ss_sp = f->stack;
	f->uc.uc_stack.ss_size = stack_bytes;
	f->uc.uc_link = nullptr;
	makecontext(&f->uc, (void (*)(void))entry::go, 2,
	            (unsigned)((uint64_t)p >> 32), (unsigned)p);
#endif
}

/* to or from NULL is the host; an exiting fiber is never resumed. */
void switch_to(fiber *from, fiber *to, bool exiting)
{
	if (to && !to->started) { /* its first run in the block */
		fiber_prepare(to);
		to->started = true;
	}
	running = to;
	cur = to ? &to->regs : nullptr;
#ifdef EMU_ASAN
	void **fake = exiting ? nullptr : from ? &from->fake : &host_fake;
	__sanitizer_start_switch_fiber(fake, to ? to->stack : host_bottom,
	                               to ? stack_bytes : host_size);
#endif
#ifdef EMU_TSAN
	__tsan_switch_to_fiber(to ? to->tsan : host_tsan, 0);
#endif
#ifdef EMU_ASM
	kvt_emu_ctx_switch(from ? &from->sp : &host_sp, to ? to->sp : host_sp);
#else
	swapcontext(from ? &from->uc : &host_uc, to ? &to->uc : &host_uc);
#endif
	/* resumed as from */
#ifdef EMU_ASAN
	__sanitizer_finish_switch_fiber(from ? from->fake : host_fake, nullptr,
	                                nullptr);
#endif
	(void)exiting;
}

/* The next runnable fiber after f in thread order, wrapping; NULL: none. */
fiber *next_ready(fiber *f)
{
	int n = n_threads, i = f->idx;
	if (n_done == n)
		return nullptr; /* the block is over: no scan of it */
	for (int k = 1; k < n; k++) {
		int j = reverse ? (i - k + n) % n : (i + k) % n;
		if (fibers[j].state == F_READY)
			return &fibers[j];
	}
	return nullptr;
}

std::string thread_name(const fiber *f)
{
	char b[80];
	if (block_dim.y == 1 && block_dim.z == 1)
		snprintf(b, sizeof(b), "thread %d", f->idx);
	else
		snprintf(b, sizeof(b), "thread %d (%u,%u,%u)", f->idx,
		         f->regs.tid.x, f->regs.tid.y, f->regs.tid.z);
	return b;
}

std::string lane_list(unsigned m)
{
	std::string s;
	for (int l = 0; l < 32; l++) {
		if (!(m >> l & 1))
			continue;
		int e = l;
		while (e + 1 < 32 && (m >> (e + 1) & 1))
			e++;
		char b[16];
		snprintf(b, sizeof(b), e > l ? "%d-%d" : "%d", l, e);
		s += (s.empty() ? "" : ",") + std::string(b);
		l = e;
	}
	return s.empty() ? "none" : s;
}

/* Ends the block: the host picks up fail_msg.  Never returns. */
[[noreturn]] void fail(fiber *f, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void fail(fiber *f, const char *fmt, ...)
{
	char b[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b, sizeof(b), fmt, ap);
	va_end(ap);
	fail_msg = b;
	failed = true;
	for (int i = 0; i < n_threads; i++)
		fibers[i].dirty = true;
	switch_to(f, nullptr, false);
	fatal("a failed block was resumed");
}

/* Where a stuck thread is. */
std::string where(const fiber &a)
{
	char b[200];
	if (a.state == F_DONE)
		return "exited";
	if (a.state == F_BAR)
		snprintf(b, sizeof(b), "wait at __syncthreads (%s:%d)",
		         base_name(a.file), a.line);
	else
		snprintf(b, sizeof(b), "wait in %s (%s:%d, mask 0x%08x)",
		         OP_NAME[a.op], base_name(a.file), a.line, a.mask);
	return b;
}

/* Every thread of a stuck block, in runs of threads in the same place,
 * then what each waiting warp op still needs. */
std::string describe_stuck(void)
{
	std::string s;
	int lines = 0;
	for (int i = 0, j; i < n_threads && lines < 24; i = j, lines++) {
		std::string here = where(fibers[i]);
		for (j = i + 1; j < n_threads && where(fibers[j]) == here; j++)
			;
		char b[64];
		if (j - i > 1)
			snprintf(b, sizeof(b), "\n  threads %d-%d: ", i, j - 1);
		else
			snprintf(b, sizeof(b), "\n  thread %d: ", i);
		s += b + here;
	}
	for (size_t w = 0; w < warps.size(); w++)
		for (const warp_wait &ww : warps[w]) {
			unsigned miss = ww.mask & ~ww.waiting;
			const fiber &m = fibers[w * 32 + __builtin_ctz(miss)];
			char b[200];
			snprintf(b, sizeof(b),
			         "\n  warp %zu: %s (%s:%d) needs lanes %s, "
			         "which never come (lane %d: ",
			         w, OP_NAME[ww.op], base_name(ww.file), ww.line,
			         lane_list(miss).c_str(), m.idx & 31);
			s += b + where(m) + ")";
		}
	if (n_bar && n_done)
		s += "\n  __syncthreads needs every thread of the block; " +
		     std::to_string(n_done) + " have exited";
	return s;
}

void schedule(fiber *f, bool exiting)
{
	fiber *n = next_ready(f);
	if (n) {
		switch_to(f, n, exiting);
		return;
	}
	if (n_done == n_threads) {
		switch_to(f, nullptr, exiting); /* the block is over */
		return;
	}
	fail(f, "deadlock: no thread can go on:%s", describe_stuck().c_str());
}

void fiber_main(fiber *f)
{
#ifdef EMU_ASAN
	const void *bottom;
	size_t size;
	__sanitizer_finish_switch_fiber(nullptr, &bottom, &size);
	if (!host_bottom && f->idx == 0) { /* the host started us */
		host_bottom = bottom;
		host_size = size;
	}
#endif
	for (;;) {
		L->run(L->obj);
		f->state = F_DONE;
		n_done++;
#if !defined(EMU_ASAN) && !defined(EMU_TSAN)
		/* The next thread in order has not run yet: it runs here, on
		 * this stack (given to it), instead of on a cold stack of its
		 * own behind a switch.  The order is the same, and a kernel
		 * without barriers runs all its threads on one stack; most
		 * of a launch of short threads was those switches. */
		fiber *n = next_ready(f);
		if (n && !n->started) {
			char *st = f->stack;
			f->stack = n->stack;
			n->stack = st;
			n->started = true;
			f = n;
			running = n;
			cur = &n->regs;
			continue;
		}
#endif
		schedule(f, true);
		fatal("an exited thread was resumed");
	}
}

unsigned warp_lanes(int w)
{
	int n = n_threads - w * 32;
	return n >= 32 ? 0xffffffffu : (1u << n) - 1;
}

/* -------------------------------------------------------------- blocks */

#ifndef EMU_ASAN
/* The emulator's own object's TLS block (emu.mk checks at link time that it
 * holds function-local statics only: the __shared__ variables).  That is
 * the executable's in kvtrim-cuda-emu-tests, and the library's own in the
 * emulated libkvtrim-cuda.so, where the process's other TLS (libuv, nng,
 * OpenBLAS, libc) lives in other objects' blocks and is never touched.
 * The calling thread's block starts at tls_anchor: the one initialised
 * thread-local (.tdata, which opens the TLS segment; the other
 * thread-locals are zero-initialised, .tbss), which emu.mk checks too.
 * (dl_iterate_phdr's dlpi_tls_data is not used: glibc may answer NULL for
 * a dlopen'd library's block when the thread's DTV is behind a later
 * dlopen.) */
char *tls_anchor(void)
{
	static thread_local char anchor = 1;
	return &anchor;
}

int find_tls(struct dl_phdr_info *info, size_t, void *)
{
	uintptr_t self = (uintptr_t)(void *)&find_tls;
	bool mine = false;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) &ph = info->dlpi_phdr[i];
		uintptr_t a = info->dlpi_addr + ph.p_vaddr;
		if (ph.p_type == PT_LOAD && self >= a && self - a < ph.p_memsz)
			mine = true;
	}
	if (!mine)
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_TLS)
			shared_size = info->dlpi_phdr[i].p_memsz;
	if (!shared_size)
		fatal("cannot find the emulator's thread-local block (the "
		      "__shared__ variables)");
	return 1;
}
#endif

void setup_once(void)
{
	static bool done;
	if (done)
		return;
	done = true;
	page_bytes = (size_t)sysconf(_SC_PAGESIZE);
	const char *e = getenv("KVT_EMU_STACK_KB");
#ifdef EMU_ASAN
	stack_bytes = 256 * 1024;
#else
	stack_bytes = 64 * 1024;
#endif
	if (e && atol(e) >= 16)
		stack_bytes = (size_t)atol(e) * 1024;
	stack_bytes = (stack_bytes + page_bytes - 1) / page_bytes * page_bytes;
	e = getenv("KVT_EMU_ORDER");
	reverse = e && !strcmp(e, "reverse");
#ifdef EMU_TSAN
	host_tsan = __tsan_get_current_fiber();
#endif
#ifndef EMU_ASAN
	dl_iterate_phdr(find_tls, nullptr);
#endif
}

void ensure_fibers(int n)
{
	size_t old = fibers.size();
	if ((size_t)n <= old)
		return;
	fibers.resize((size_t)n);
	for (size_t i = old; i < (size_t)n; i++) {
		const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
		char *m = (char *)mmap(nullptr, stack_bytes + page_bytes,
		                       PROT_READ | PROT_WRITE, flags, -1, 0);
		if (m == MAP_FAILED)
			fatal("out of memory for fiber stacks");
		mprotect(m, page_bytes, PROT_NONE); /* overflow faults */
		fibers[i].stack = m + page_bytes;
		fibers[i].dirty = false;
#ifdef EMU_TSAN
		fibers[i].tsan = __tsan_create_fiber(0);
#endif
	}
}

/* Blocks of a launch whose shared memory starts as 0xff bytes; the later
 * ones keep what the block before them left, as a device's blocks find
 * what an earlier block on their multiprocessor left.  A kernel that reads
 * shared memory before writing it reads garbage in its first blocks
 * already; poisoning every block cost a memset of the library's whole
 * __shared__ block (hundreds of KiB) per block, most of a big grid's time. */
#define POISONED_BLOCKS 64

/* Runs block block_idx, the nth of its launch, with n threads; false
 * when it failed. */
bool run_block(int n, uint64_t nth)
{
	n_threads = n;
	n_done = n_bar = 0;
	failed = false;
	warps.resize((size_t)(n + 31) / 32);
	for (std::vector<warp_wait> &w : warps)
		w.clear();
	/* shared memory starts out as garbage on the device */
	if (shared_tls && nth < POISONED_BLOCKS)
		memset(shared_tls, 0xff, shared_size);
	if (L->smem && nth < POISONED_BLOCKS)
		memset(dyn_buf, 0xff, L->smem);
	/* thread indices counted up, x fastest (no divisions: a block of
	 * short threads spent as long here as running them) */
	unsigned tx = 0, ty = 0, tz = 0;
	for (int i = 0; i < n; i++) {
		fiber &f = fibers[i];
		f.regs.tid = make_uint3(tx, ty, tz);
		if (++tx == block_dim.x) {
			tx = 0;
			if (++ty == block_dim.y) {
				ty = 0;
				tz++;
			}
		}
		f.idx = i;
		f.state = F_READY;
		f.file = "";
		f.line = 0;
		f.op = 0;
		f.started = false; /* prepared when it first runs */
	}
	switch_to(nullptr, &fibers[reverse ? n - 1 : 0], false);
	return !failed;
}

/* -------------------------------------------------------------- faults */

#ifndef EMU_ASAN
/* A fault inside a kernel names the kernel, block and thread before the
 * process dies of it (ASan has its own, better report). */
void on_fault(int sig, siginfo_t *si, void *)
{
	if (L && running) {
		char b[640];
		uintptr_t a = (uintptr_t)si->si_addr;
		uintptr_t st = (uintptr_t)running->stack;
		int n = snprintf(
			b, sizeof(b),
			"cuda emulator: %s at address %p in %s (launched at "
			"%s:%d), block (%u,%u,%u), thread (%u,%u,%u)%s\n",
			sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", si->si_addr,
			L->name, L->file, L->line, block_idx.x, block_idx.y,
			block_idx.z, running->regs.tid.x, running->regs.tid.y,
			running->regs.tid.z,
			a < st && a + page_bytes >= st
				? ": fiber stack overflow (KVT_EMU_STACK_KB)"
				: "");
		if (n > 0 && write(2, b, (size_t)n) < 0)
			n = 0;
	}
	/* SA_RESETHAND: the fault repeats with the default action */
}

void install_fault_handler(void)
{
	static bool done;
	if (done)
		return;
	done = true;
	static char alt[64 * 1024];
	stack_t ss;
	ss.ss_sp = alt;
	ss.ss_size = sizeof(alt);
	ss.ss_flags = 0;
	sigaltstack(&ss, nullptr);
	for (int sig : {SIGSEGV, SIGBUS}) {
		struct sigaction old, sa;
		if (sigaction(sig, nullptr, &old) || old.sa_handler != SIG_DFL)
			continue; /* someone else's: leave it */
		memset(&sa, 0, sizeof(sa));
		sa.sa_sigaction = on_fault;
		sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
		sigemptyset(&sa.sa_mask);
		sigaction(sig, &sa, nullptr);
	}
}
#endif

#ifdef EMU_ASAN
} /* namespace */
} /* namespace kvt_emu */

/* ASan calls this before its report: say which kernel thread it was. */
extern "C" void __asan_on_error(void)
{
	using namespace kvt_emu;
	if (L && running)
		fprintf(stderr,
		        "cuda emulator: in %s (launched at %s:%d), block "
		        "(%u,%u,%u), thread (%u,%u,%u):\n",
		        L->name, L->file, L->line, block_idx.x, block_idx.y,
		        block_idx.z, running->regs.tid.x, running->regs.tid.y,
		        running->regs.tid.z);
}

namespace kvt_emu {
namespace {
#endif

long bounds_of(const launch_desc &d)
{
	/* "(pa_split_kernel<T, HDMAX, 1>)" -> pa_split_kernel */
	const char *p = d.name;
	while (*p == '(' || *p == ' ')
		p++;
	size_t n = 0;
	while (p[n] == '_' || (p[n] >= 'a' && p[n] <= 'z') ||
	       (p[n] >= 'A' && p[n] <= 'Z') || (p[n] >= '0' && p[n] <= '9'))
		n++;
	std::string name(p, n), file = base_name(d.file);
	const bounds_entry *by_name = nullptr;
	int n_by_name = 0;
	for (const bounds_entry &b : bounds()) {
		if (b.name != name)
			continue;
		if (b.file == file)
			return b.max_threads;
		by_name = &b;
		n_by_name++;
	}
	return n_by_name == 1 ? by_name->max_threads : (long)DEV_MAX_THREADS;
}

std::string describe(const launch_desc &d)
{
	char b[512];
	snprintf(b, sizeof(b),
	         "%s (launched at %s:%d, grid (%u,%u,%u), block (%u,%u,%u), "
	         "%zu bytes of dynamic shared memory)",
	         d.name, d.file, d.line, d.grid.x, d.grid.y, d.grid.z,
	         d.block.x, d.block.y, d.block.z, d.smem);
	return b;
}

bool config_ok(const launch_desc &d)
{
	const dim3 &g = d.grid, &b = d.block;
	uint64_t nt = (uint64_t)b.x * b.y * b.z;
	if (!g.x || !g.y || !g.z || g.x > 0x7fffffffu || g.y > 65535 ||
	    g.z > 65535) {
		note("%s: invalid grid", describe(d).c_str());
		set_error(cudaErrorInvalidConfiguration, false);
		return false;
	}
	if (!nt || b.x > 1024 || b.y > 1024 || b.z > 64 ||
	    nt > DEV_MAX_THREADS) {
		note("%s: invalid block", describe(d).c_str());
		set_error(cudaErrorInvalidConfiguration, false);
		return false;
	}
	long lb = bounds_of(d);
	if ((long)nt > lb) {
		note("%s: %llu threads per block, beyond the kernel's "
		     "__launch_bounds__(%ld)",
		     describe(d).c_str(), (unsigned long long)nt, lb);
		set_error(cudaErrorLaunchOutOfResources, false);
		return false;
	}
	int opt = func_max_dyn_smem(d.func);
	size_t lim = opt >= 0 ? (size_t)opt : (size_t)DEV_SMEM_DEFAULT;
	if (d.smem > lim) {
		note("%s: more dynamic shared memory than the %zu bytes "
		     "allowed (%s)",
		     describe(d).c_str(), lim,
		     opt >= 0 ? "cudaFuncSetAttribute"
		              : "the default; more needs cudaFuncSetAttribute");
		set_error(cudaErrorInvalidValue, false);
		return false;
	}
	if (!is_stream(d.stream)) {
		note("%s: not a stream", describe(d).c_str());
		set_error(cudaErrorInvalidResourceHandle, false);
		return false;
	}
	return true;
}

} /* namespace */

/* ---------------------------------------------------------- interface */

int register_bounds(const char *file, const char *name, long max_threads)
{
	bounds().push_back(bounds_entry{base_name(file), name, max_threads});
	return 0;
}

void launch(const launch_desc &d)
{
	/* Host threads take turns; the launch runs on the caller's. */
	EMU_API_LOCK();
	launches_total++;
	if (L)
		fatal("a kernel launched a kernel");
	if (cudaError_t e = sticky_error()) {
		set_error(e, true);
		return;
	}
	if (!config_ok(d))
		return;
	setup_once();
#ifndef EMU_ASAN
	shared_tls = tls_anchor(); /* this host thread's __shared__ */
	install_fault_handler();
#endif
#ifdef EMU_ASM
	mxcsr_cw[0] = __builtin_ia32_stmxcsr();
	unsigned short cw;
	__asm__ volatile("fnstcw %0" : "=m"(cw));
	mxcsr_cw[1] = cw;
#endif
	int nt = (int)(d.block.x * d.block.y * d.block.z);
	threads_total += (uint64_t)nt * d.grid.x * d.grid.y * d.grid.z;
	ensure_fibers(nt);
	dyn_buf = nullptr;
	if (posix_memalign(&dyn_buf, 16, d.smem ? d.smem : 16))
		fatal("out of memory for dynamic shared memory");
	L = &d;
	block_dim = d.block;
	grid_dim = d.grid;
	bool ok = true;
	uint64_t nth = 0;
	for (unsigned z = 0; ok && z < d.grid.z; z++)
		for (unsigned y = 0; ok && y < d.grid.y; y++)
			for (unsigned x = 0; ok && x < d.grid.x; x++) {
				block_idx = make_uint3(x, y, z);
				ok = run_block(nt, nth++);
			}
	L = nullptr;
	free(dyn_buf);
	dyn_buf = nullptr;
	if (!ok) {
		note("%s: block (%u,%u,%u): %s", describe(d).c_str(),
		     block_idx.x, block_idx.y, block_idx.z, fail_msg.c_str());
		set_error(cudaErrorLaunchFailure, true);
	}
}

void *dyn_shared(void)
{
	if (!running)
		fatal("dynamic shared memory used outside a kernel");
	return dyn_buf;
}

void syncthreads(const char *file, int line)
{
	fiber *f = running;
	if (!f)
		fatal("__syncthreads outside a kernel");
	if (n_bar == 0) {
		bar_file = file;
		bar_line = line;
	} else if (line != bar_line ||
	           (file != bar_file && strcmp(file, bar_file))) {
		fail(f,
		     "barrier divergence: %s reaches __syncthreads at %s:%d "
		     "while %d threads wait at the one at %s:%d",
		     thread_name(f).c_str(), base_name(file), line, n_bar,
		     base_name(bar_file), bar_line);
	}
	if (++n_bar == n_threads) { /* the last one: release the block */
		n_bar = 0;
		for (int i = 0; i < n_threads; i++)
			if (fibers[i].state == F_BAR)
				fibers[i].state = F_READY;
		return;
	}
	f->state = F_BAR;
	f->file = file;
	f->line = line;
	schedule(f, false);
}

uint64_t warp(int op, unsigned mask, uint64_t value, int arg, int width,
              const char *file, int line)
{
	fiber *f = running;
	if (!f)
		fatal("warp intrinsic outside a kernel");
	const int lane = f->idx & 31, w = f->idx >> 5;
	const unsigned exist = warp_lanes(w);
	if (!(mask >> lane & 1))
		fail(f, "%s at %s:%d: %s is lane %d, not in the mask 0x%08x",
		     OP_NAME[op], base_name(file), line, thread_name(f).c_str(),
		     lane, mask);
	if (mask & ~exist)
		fail(f,
		     "%s at %s:%d: the mask 0x%08x names lanes %s of warp %d, "
		     "which the block does not have",
		     OP_NAME[op], base_name(file), line, mask,
		     lane_list(mask & ~exist).c_str(), w);
	if (width < 1 || width > 32 || (width & (width - 1)))
		fail(f, "%s at %s:%d: width %d is not a power of two <= 32",
		     OP_NAME[op], base_name(file), line, width);
	/* Lanes of the same mask must all be in the same op at the same line
	 * (the programming guide's rule; sm_70 would even pair different
	 * shuffles of the same kind, which no kernel should rely on). */
	std::vector<warp_wait> &groups = warps[(size_t)w];
	size_t gi = 0;
	for (; gi < groups.size(); gi++) {
		const warp_wait &o = groups[gi];
		if (o.mask != mask)
			continue;
		if (o.op != op || o.line != line ||
		    (o.file != file && strcmp(o.file, file)))
			fail(f,
			     "warp divergence: lane %d of warp %d calls %s at "
			     "%s:%d (mask 0x%08x) while lanes %s wait in %s at "
			     "%s:%d (mask 0x%08x)",
			     lane, w, OP_NAME[op], base_name(file), line, mask,
			     lane_list(o.waiting).c_str(), OP_NAME[o.op],
			     base_name(o.file), o.line, o.mask);
		break;
	}
	if (gi == groups.size())
		groups.push_back(warp_wait{0, mask, op, file, line});
	warp_wait &ww = groups[gi];
	f->op = op;
	f->mask = mask;
	f->arg = arg;
	f->width = width;
	f->in = value;
	f->file = file;
	f->line = line;
	ww.waiting |= 1u << lane;
	if (ww.waiting != mask) {
		f->state = F_WARP;
		schedule(f, false);
		return f->out;
	}

	/* The last lane: every lane's result, then everyone goes on. */
	fiber *lanes = &fibers[(size_t)w * 32];
	groups.erase(groups.begin() + (long)gi);
	uint64_t vote = 0;
	for (int l = 0; l < 32; l++)
		if (mask >> l & 1)
			vote |= (uint64_t)(lanes[l].in != 0) << l;
	for (int l = 0; l < 32; l++) {
		if (!(mask >> l & 1))
			continue;
		fiber &g = lanes[l];
		/* shfl.sync as the PTX ISA defines it: b masked to 5 bits,
		 * segments of width lanes, out of range reads the own value */
		const int segmask = (32 - g.width) & 31, b = g.arg & 31;
		const int min_lane = l & segmask;
		const int max_lane = min_lane | (31 & ~segmask);
		int src = l;
		switch (op) {
		case W_SYNC:
			g.out = 0;
			break;
		case W_BALLOT:
			g.out = vote;
			break;
		case W_ANY:
			g.out = vote != 0;
			break;
		case W_ALL:
			g.out = vote == mask;
			break;
		default:
			if (op == W_SHFL)
				src = min_lane | (b & ~segmask);
			else if (op == W_SHFL_UP)
				src = l - b;
			else if (op == W_SHFL_DOWN)
				src = l + b;
			else
				src = l ^ b;
			if ((op == W_SHFL_UP && src < min_lane) ||
			    (op != W_SHFL_UP && src > max_lane))
				src = l;
			if (!(mask >> src & 1))
				fail(f,
				     "%s at %s:%d: lane %d of warp %d reads "
				     "lane %d, which is not in the mask 0x%08x "
				     "(an undefined value on the device)",
				     OP_NAME[op], base_name(file), line, l, w,
				     src, mask);
			g.out = lanes[src].in;
			break;
		}
		if (&g != f)
			g.state = F_READY;
	}
	return f->out;
}

} /* namespace kvt_emu */
