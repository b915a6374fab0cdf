; fast.asm: the fast instruction-set level of the hot kernel (AVX + F16C, VEX encoded), chosen
; at start-up by cpu.asm. Never executed on a CPU without AVX, F16C and OS-saved YMM state.

; matmul_f16_avx2: matmul_f16 (kernels.asm) with AVX + F16C, bit-identical to it: the same
; float32 operations in the same order (8 lanes, columns j mod 8, one ymm register per row;
; leftover columns one at a time into lane 0; ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 +
; l7)); then + xout). W (d,n) f16 @ x (n,) -> xout (d,); r9d != 0 adds to xout. Two rows at a
; time (two independent chains of additions); an odd last row is computed twice, stored once.
; The weights are prefetched 8 KB ahead (for 2048-column rows: the next pair): the hardware
; prefetchers stop at 4 KB pages; this doubled the single-thread decode speed on Gemma-2B.
; No FMA on purpose: a fused multiply-add rounds once and would part from the baseline's bits;
; decode is bound by memory bandwidth, not by the multiplications.
;   in: rdi xout, rsi x, rdx W (rows of n halves, contiguous), ecx n, r8d d, r9d accumulate
;   out: xout   clobbers: rax rcx rdx rdi r8 r10 r11 xmm0-xmm3 (upper ymm halves cleared)
PREFETCH_AHEAD = 8192

matmul_f16_avx2:
        mov     ecx, ecx
.rows:
        lea     r11, [rdx+rcx*2]        ; row b
        cmp     r8d, 1
        jne     .pair
        mov     r11, rdx                ; the last, odd row: row a again
.pair:
        vxorps  xmm0, xmm0, xmm0        ; row a's 8 lanes (clears the whole ymm)
        vxorps  xmm3, xmm3, xmm3        ; row b's
        xor     eax, eax                ; column
.col:
        lea     r10d, [rax+8]
        cmp     r10d, ecx
        ja      .one
        prefetcht0 [rdx+rax*2+PREFETCH_AHEAD]
        prefetcht0 [r11+rax*2+PREFETCH_AHEAD]
        vmovups ymm2, [rsi+rax*4]
        vcvtph2ps ymm1, [rdx+rax*2]     ; exact
        vmulps  ymm1, ymm1, ymm2
        vaddps  ymm0, ymm0, ymm1
        vcvtph2ps ymm1, [r11+rax*2]
        vmulps  ymm1, ymm1, ymm2
        vaddps  ymm3, ymm3, ymm1
        mov     eax, r10d
        jmp     .col
.one:
        cmp     eax, ecx
        jae     .sum
        vmovss  xmm2, [rsi+rax*4]       ; lanes 1-7: 0
        movzx   r10d, word [rdx+rax*2]
        vmovd   xmm1, r10d
        vcvtph2ps xmm1, xmm1
        vmulps  xmm1, xmm1, xmm2
        vaddps  ymm0, ymm0, ymm1        ; adding +0 to lanes 1-7 changes nothing
        movzx   r10d, word [r11+rax*2]
        vmovd   xmm1, r10d
        vcvtph2ps xmm1, xmm1
        vmulps  xmm1, xmm1, xmm2
        vaddps  ymm3, ymm3, ymm1
        inc     eax
        jmp     .one
.sum:
        vextractf128 xmm1, ymm0, 1
        vaddps  xmm0, xmm0, xmm1
        vextractf128 xmm2, ymm3, 1
        vaddps  xmm3, xmm3, xmm2
        vhaddps xmm0, xmm0, xmm3
        vhaddps xmm0, xmm0, xmm0        ; row a's sum, row b's sum, a, b
        lea     rdx, [r11+rcx*2]        ; the next pair
        push    2
        pop     r10
.put:
        test    r9d, r9d
        jz      .store
        vaddss  xmm0, xmm0, [rdi]
.store:
        vmovss  [rdi], xmm0
        add     rdi, 4
        dec     r8d
        jz      .done
        vmovshdup xmm0, xmm0            ; row b's sum to lane 0
        dec     r10d
        jnz     .put
        jmp     .rows
.done:
        vzeroupper
        ret
