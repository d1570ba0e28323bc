/*
 * A single-threaded target for injection tests: it blocks in a raw read(2)
 * of stdin with known values in every register the syscall instruction
 * keeps (all but rax, rcx and r11) and in xmm0-xmm15, then checks them all
 * when the read returns. An injection that lost a register, or turned the
 * read into an error, fails it with a line saying which.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
	static uint8_t xin[256], xout[256];
	for (int i = 0; i < 256; i++)
		xin[i] = (uint8_t)(i * 7 + 3);
	printf("ready\n");
	fflush(stdout);
	for (int round = 0;; round++) {
		char buf[64];
		uint64_t g[9];
		const uint64_t want[9] = {
			0, (uint64_t)buf, sizeof(buf) - 1, 0x0808080808080808ull,
			0x0909090909090909ull, 0x1010101010101010ull, 0x1212121212121212ull,
			0x1313131313131313ull, 0x1414141414141414ull,
		};
		struct {
			const uint8_t *xin;
			const uint64_t *want;
			uint64_t *g;
			uint8_t *xout;
			int64_t ret;
		} c = {xin, want, g, xout, 0};
		/* rbx holds &c across the syscall (the kernel keeps it). */
		__asm__ volatile(
			"mov 0(%%rbx), %%rax\n\t"
			"movdqu 0(%%rax), %%xmm0\n\t"
			"movdqu 16(%%rax), %%xmm1\n\t"
			"movdqu 32(%%rax), %%xmm2\n\t"
			"movdqu 48(%%rax), %%xmm3\n\t"
			"movdqu 64(%%rax), %%xmm4\n\t"
			"movdqu 80(%%rax), %%xmm5\n\t"
			"movdqu 96(%%rax), %%xmm6\n\t"
			"movdqu 112(%%rax), %%xmm7\n\t"
			"movdqu 128(%%rax), %%xmm8\n\t"
			"movdqu 144(%%rax), %%xmm9\n\t"
			"movdqu 160(%%rax), %%xmm10\n\t"
			"movdqu 176(%%rax), %%xmm11\n\t"
			"movdqu 192(%%rax), %%xmm12\n\t"
			"movdqu 208(%%rax), %%xmm13\n\t"
			"movdqu 224(%%rax), %%xmm14\n\t"
			"movdqu 240(%%rax), %%xmm15\n\t"
			"mov 8(%%rbx), %%rax\n\t"
			"mov 24(%%rax), %%r8\n\t"
			"mov 32(%%rax), %%r9\n\t"
			"mov 40(%%rax), %%r10\n\t"
			"mov 48(%%rax), %%r12\n\t"
			"mov 56(%%rax), %%r13\n\t"
			"mov 64(%%rax), %%r14\n\t"
			"mov 0(%%rax), %%rdi\n\t"
			"mov 8(%%rax), %%rsi\n\t"
			"mov 16(%%rax), %%rdx\n\t"
			"xor %%eax, %%eax\n\t" /* read */
			"syscall\n\t"
			"mov %%rax, 32(%%rbx)\n\t"
			"mov 24(%%rbx), %%rcx\n\t"
			"movdqu %%xmm0, 0(%%rcx)\n\t"
			"movdqu %%xmm1, 16(%%rcx)\n\t"
			"movdqu %%xmm2, 32(%%rcx)\n\t"
			"movdqu %%xmm3, 48(%%rcx)\n\t"
			"movdqu %%xmm4, 64(%%rcx)\n\t"
			"movdqu %%xmm5, 80(%%rcx)\n\t"
			"movdqu %%xmm6, 96(%%rcx)\n\t"
			"movdqu %%xmm7, 112(%%rcx)\n\t"
			"movdqu %%xmm8, 128(%%rcx)\n\t"
			"movdqu %%xmm9, 144(%%rcx)\n\t"
			"movdqu %%xmm10, 160(%%rcx)\n\t"
			"movdqu %%xmm11, 176(%%rcx)\n\t"
			"movdqu %%xmm12, 192(%%rcx)\n\t"
			"movdqu %%xmm13, 208(%%rcx)\n\t"
			"movdqu %%xmm14, 224(%%rcx)\n\t"
			"movdqu %%xmm15, 240(%%rcx)\n\t"
			"mov 16(%%rbx), %%rcx\n\t"
			"mov %%rdi, 0(%%rcx)\n\t"
			"mov %%rsi, 8(%%rcx)\n\t"
			"mov %%rdx, 16(%%rcx)\n\t"
			"mov %%r8, 24(%%rcx)\n\t"
			"mov %%r9, 32(%%rcx)\n\t"
			"mov %%r10, 40(%%rcx)\n\t"
			"mov %%r12, 48(%%rcx)\n\t"
			"mov %%r13, 56(%%rcx)\n\t"
			"mov %%r14, 64(%%rcx)\n\t"
			:
			: "b"(&c)
			: "rax", "rcx", "r11", "rdi", "rsi", "rdx", "r8", "r9", "r10", "r12", "r13",
			  "r14", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
			  "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory", "cc");
		int64_t ret = c.ret;
		if (ret < 0) {
			printf("read failed: %lld\n", (long long)ret);
			return 2;
		}
		for (int i = 0; i < 9; i++)
			if (g[i] != want[i]) {
				printf("register %d corrupted: %llx\n", i, (unsigned long long)g[i]);
				return 1;
			}
		if (memcmp(xin, xout, sizeof(xin)) != 0) {
			printf("xmm registers corrupted\n");
			return 1;
		}
		if (ret == 0)
			break;
		printf("round %d ok\n", round);
		fflush(stdout);
	}
	printf("done\n");
	return 0;
}
