; fast.asm: the fast instruction-set level of the hot kernel (AVX + FMA + F16C, VEX encoded),
; chosen at start-up by cpu.asm. Never executed on a CPU without them and OS-saved YMM state.

; matmul_f16_avx2: matmul_f16's product (kernels.asm) for k tokens at once, with fused
; multiply-adds, for n a multiple of 8: xout_t (d,) = W (d,n) f16 @ x_t (n,) for t < k,
; x_t = x + 4nt bytes, xout_t = xout + t ostride bytes; r9d != 0 adds to xout_t.
; Two rows by up to four tokens at a time in 8 ymm accumulators: each 8 halves of the two
; rows are converted once and multiplied by the same 8 columns of every token (a computed
; jump enters the unrolled tokens at k), so a block of prompt tokens costs its weights' reads
; and conversions once per 4 tokens.
; The float32 arithmetic of one (row, token) never depends on k, on the other row or on the
; row split: lane i sums the columns j = i mod 8 by one fused multiply-add each (rounded once),
; then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), then + xout. So every prompt block
; and thread count gives the same bits; they differ from the baseline's (each product rounded
; before its add) by a few ulp of the sum. An odd last row is computed twice, stored once.
; The weights are prefetched 8 KB ahead (for 2048-column rows: the next pair): the hardware
; prefetchers stop at 4 KB pages; this doubled the single-thread decode speed on Gemma-2B.
;   in: rdi xout, rsi x, rdx W (rows of n halves, contiguous), ecx n (8, 16, ...), r8d d,
;   r9d accumulate; stack: k (1..4, low dword), ostride (a qword)
;   out: xout_t   clobbers: rax rcx rdx rdi rsi r8-r11 xmm0-xmm15 (upper halves cleared)
FAST_TOKENS = 4                         ; tokens per call at most (cpu.asm: job_tokens)
TOKEN_CODE = 16         ; bytes of each of .t3, .t2, .t1 (one token; k = 2..4 tests catch a change)
PREFETCH_AHEAD = 8192

matmul_f16_avx2:
        push    rbx
        push    r9                      ; [rsp]: accumulate; k at [rsp+24], ostride [rsp+32]
        imul    r10d, ecx, 4            ; s: bytes of an x_t
        lea     r11, [r10+r10*2]        ; 3s
        imul    eax, [rsp+24], TOKEN_CODE
        lea     rbx, [.t0+TOKEN_CODE]
        sub     rbx, rax                ; where the unrolled tokens are entered
.pair:
        mov     rcx, r10
        shr     rcx, 1                  ; 2n: row b's offset from row a
        cmp     r8d, 1
        jne     .two
        xor     ecx, ecx                ; the last, odd row: row b = row a
.two:
        vzeroall                        ; ymm0-3: row a, tokens 0-3; ymm4-7: row b
        mov     eax, r10d               ; bytes of x_t to go
        jmp     .top
.t3:
        vmovups ymm10, [rsi+r11]
        vfmadd231ps ymm3, ymm8, ymm10
        vfmadd231ps ymm7, ymm9, ymm10
.t2:
        vmovups ymm10, [rsi+r10*2]
        vfmadd231ps ymm2, ymm8, ymm10
        vfmadd231ps ymm6, ymm9, ymm10
.t1:
        vmovups ymm10, [rsi+r10]
        vfmadd231ps ymm1, ymm8, ymm10
        vfmadd231ps ymm5, ymm9, ymm10
.t0:
        vmovups ymm10, [rsi]
        vfmadd231ps ymm0, ymm8, ymm10
        vfmadd231ps ymm4, ymm9, ymm10
        add     rsi, 32
.top:
        sub     eax, 32
        jb      .sum
        prefetcht0 [rdx+PREFETCH_AHEAD]
        prefetcht0 [rdx+rcx+PREFETCH_AHEAD]
        vcvtph2ps ymm8, [rdx]           ; exact
        vcvtph2ps ymm9, [rdx+rcx]
        add     rdx, 16
        jmp     rbx
.sum:
        vhaddps ymm0, ymm0, ymm1
        vhaddps ymm2, ymm2, ymm3
        vhaddps ymm4, ymm4, ymm5
        vhaddps ymm6, ymm6, ymm7
        vhaddps ymm0, ymm0, ymm2        ; lanes 0-3 of each token's row a, then lanes 4-7
        vhaddps ymm4, ymm4, ymm6        ; row b's
        vperm2f128 ymm1, ymm0, ymm4, 0x20
        vperm2f128 ymm0, ymm0, ymm4, 0x31
        vaddps  ymm0, ymm1, ymm0        ; row a's sums for tokens 0-3, row b's for 0-3
        vextractf128 xmm1, ymm0, 1
        sub     rsi, r10                ; x again
        add     rdx, rcx                ; the next pair
        push    2
        pop     rcx                     ; rows to store
.row:
        mov     r9, rdi
        mov     eax, [rsp+24]           ; k
.put:
        cmp     dword [rsp], 0
        je      .store
        vaddss  xmm0, xmm0, [r9]
.store:
        vmovss  [r9], xmm0
        vpermilps xmm0, xmm0, 0x39      ; the next token's sum to lane 0
        add     r9, [rsp+32]
        dec     eax
        jnz     .put
        add     rdi, 4
        dec     r8d
        jz      .done
        vmovaps xmm0, xmm1              ; row b
        loop    .row
        jmp     .pair
.done:
        vzeroupper
        pop     r9
        pop     rbx
        ret
