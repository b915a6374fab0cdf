; fast.asm: the fast instruction-set level of the hot kernel (AVX + F16C, VEX encoded), chosen
; at start-up by cpu.asm. Never executed on a CPU without AVX, F16C and OS-saved YMM state.

; matmul_f16_avx2: matmul_f16 (kernels.asm) with AVX + F16C, bit-identical to it: the same
; float32 operations in the same order (each row: columns j mod 4 in 4 lanes while 4 remain,
; leftover columns one at a time into lane 0, then (l0 + l1) + (l2 + l3), then + xout).
; W (d,n) f16 @ x (n,) -> xout (d,); r9d != 0 adds to xout. Two rows share one ymm register
; (row a in the low half, row b in the high half, x broadcast to both); an odd last row is
; computed in both halves and stored once. No FMA on purpose: a fused multiply-add rounds once
; and would part from the baseline's bits; decode is bound by memory bandwidth, not by this.
;   in: rdi xout, rsi x, rdx W (rows of n halves, contiguous), ecx n, r8d d, r9d accumulate
;   out: xout   clobbers: rax rcx rdx rdi r8 r10 r11 xmm0-xmm2 (upper ymm halves cleared)
matmul_f16_avx2:
        mov     ecx, ecx
.rows:
        lea     r11, [rdx+rcx*2]        ; row b
        cmp     r8d, 1
        jne     .pair
        mov     r11, rdx                ; the last, odd row: row a again
.pair:
        vxorps  xmm0, xmm0, xmm0        ; (clears the whole ymm0)
        xor     eax, eax                ; column
.col:
        lea     r10d, [rax+4]
        cmp     r10d, ecx
        ja      .one
        vmovq   xmm1, [rdx+rax*2]       ; 4 halves of row a
        vmovhps xmm1, xmm1, [r11+rax*2] ; 4 halves of row b
        vbroadcastf128 ymm2, [rsi+rax*4]
        mov     eax, r10d
        jmp     .cvt
.one:
        movzx   r10d, word [rdx+rax*2]  ; 1 half of each row, in lanes 0 and 4; the rest 0
        vmovd   xmm1, r10d
        vpinsrw xmm1, xmm1, [r11+rax*2], 4
        vmovss  xmm2, [rsi+rax*4]
        vinsertf128 ymm2, ymm2, xmm2, 1
        inc     eax
.cvt:
        vcvtph2ps ymm1, xmm1            ; exact
        vmulps  ymm1, ymm1, ymm2
        vaddps  ymm0, ymm0, ymm1
        cmp     eax, ecx
        jb      .col
        vextractf128 xmm1, ymm0, 1
        vhaddps xmm0, xmm0, xmm1
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
