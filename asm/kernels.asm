; kernels.asm: the neural-net operations, baseline instruction set (SSE..SSE4.1 + x87).
; SysV functions, output first, position independent; they know nothing of the model. Those
; that need exp call math.asm (a leaf on the x87 stack). Vectors are float32 unless named f16.
; Dimensions are >= 1.

; matmul_f16: W (d,n) f16 @ x (n,) -> xout (d,); r9d != 0 adds to xout instead (residuals).
; FP16 -> FP32, exact for normal and subnormal halves: dword = half << 16; psrad 3 puts
; exponent and mantissa in float32 position (bias 15 instead of 127) and smears the sign over
; bits 31..28; and 0x8FFFFFFF keeps it once; times 2^112 rebiases (subnormal halves become
; float32 subnormals: exact, as MXCSR has no DAZ). Inf/NaN halves are not supported.
; The order of the float32 operations (matmul_f16_avx2 has its own, fused): a row sums in
; 8 lanes, columns j mod 8 (lanes 0-3 in xmm0, 4-7 in xmm4), 8 columns at a time while 8
; remain; the leftover columns one at a time into lane 0; then ((l0 + l4) + (l1 + l5)) +
; ((l2 + l6) + (l3 + l7)); then + xout when accumulating. Every product is rounded.
;   in: rdi xout, rsi x, rdx W (rows of n halves, contiguous), ecx n, r8d d, r9d accumulate
;   out: xout   clobbers: rax rcx rdx rdi r8 r10 r11 xmm0-xmm4 xmm6 xmm7
matmul_f16:
        lea     r10, [.col]             ; a row's loop (matmul_q8 has its own)
.setup:
        mov     rax, 0x778000008FFFFFFF ; 2^112 (float32 bits), the mask
        movq    xmm6, rax
        pshufd  xmm7, xmm6, 0x55        ; 2^112 in every lane
        shufps  xmm6, xmm6, 0           ; 0x8FFFFFFF in every lane
.row:
        xorps   xmm0, xmm0
        xorps   xmm4, xmm4
        xor     eax, eax                ; column
        jmp     r10
.col:
        lea     r11d, [rax+8]
        cmp     r11d, ecx
        ja      .one
        movups  xmm1, [rdx+rax*2]       ; 8 halves
        xorps   xmm3, xmm3
        punpckhwd xmm3, xmm1            ; columns j+4 .. j+7
        psrad   xmm3, 3
        andps   xmm3, xmm6
        mulps   xmm3, xmm7
        movups  xmm2, [rsi+rax*4+16]
        mulps   xmm3, xmm2
        addps   xmm4, xmm3
        movups  xmm2, [rsi+rax*4]       ; columns j .. j+3: below
        mov     eax, r11d
.cvt:
        xorps   xmm3, xmm3
        punpcklwd xmm3, xmm1
        psrad   xmm3, 3
        andps   xmm3, xmm6
        mulps   xmm3, xmm7
        mulps   xmm3, xmm2
        addps   xmm0, xmm3
        cmp     eax, ecx
        jb      .col
        lea     rdx, [rdx+rax*2]        ; the next row (eax = n, upper half zero)
.sum:
        addps   xmm0, xmm4
        haddps  xmm0, xmm0
        haddps  xmm0, xmm0
        test    r9d, r9d
        jz      .store
        addss   xmm0, [rdi]
.store:
        movd    eax, xmm0
        stosd
        dec     r8d
        jnz     .row
        ret
.one:                                   ; (out of the loop: its jumps stay short)
        xorps   xmm1, xmm1
        pinsrw  xmm1, word [rdx+rax*2], 0       ; 1 half, other lanes 0
        movss   xmm2, [rsi+rax*4]
        inc     eax
        jmp     .cvt

; matvec_t_f32: W^T (d,n) @ x (n,) -> xout (d,), xout[j] = sum_i x[i] W[i*r9 + 4j] (o = V^T att).
; Sums in order of i, one float32 accumulator per output: 16 adjacent outputs at a time in
; the lanes of four registers (four addition chains in flight), the last d mod 16 by
; matvec_strided.
;   in: rdi xout, rsi x, rdx W, ecx n, r8d d, r9 row stride in bytes   out: xout
;   clobbers: rax rdx rdi r8-r11 xmm0-xmm5
MATVEC_LANES = 4                        ; float32 lanes per SSE register
matvec_t_f32:
        mov     r10, r9
        push    4
        pop     r9
.group:
        cmp     r8d, 4*MATVEC_LANES
        jb      matvec_strided          ; the last d mod 16 outputs
        xorps   xmm0, xmm0
        xorps   xmm3, xmm3
        xorps   xmm4, xmm4
        xorps   xmm5, xmm5
        mov     rax, rdx
        xor     r11d, r11d
.qcol:
        movss   xmm1, [rsi+r11*4]
        shufps  xmm1, xmm1, 0           ; x[i] in every lane
        movups  xmm2, [rax]
        mulps   xmm2, xmm1
        addps   xmm0, xmm2
        movups  xmm2, [rax+4*MATVEC_LANES]
        mulps   xmm2, xmm1
        addps   xmm3, xmm2
        movups  xmm2, [rax+8*MATVEC_LANES]
        mulps   xmm2, xmm1
        addps   xmm4, xmm2
        movups  xmm2, [rax+12*MATVEC_LANES]
        mulps   xmm2, xmm1
        addps   xmm5, xmm2
        add     rax, r10
        inc     r11d
        cmp     r11d, ecx
        jb      .qcol
        movups  [rdi], xmm0
        movups  [rdi+4*MATVEC_LANES], xmm3
        movups  [rdi+8*MATVEC_LANES], xmm4
        movups  [rdi+12*MATVEC_LANES], xmm5
        add     rdi, 16*MATVEC_LANES
        add     rdx, 16*MATVEC_LANES
        sub     r8d, 4*MATVEC_LANES
        jmp     .group
; matvec_f32: W (d,n) @ x (n,) -> xout (d,), row i of W at W + i*r9 bytes (att = K q).
;   in: rdi xout, rsi x, rdx W, ecx n, r8d d, r9 row stride in bytes   out: xout
;   clobbers: rax rdx rdi r8 r10 r11 xmm0-xmm3
matvec_f32:
        push    4
        pop     r10                     ; column stride
; matvec_strided: xout[i] = sum_j W[i*r9 + j*r10] x[j], i < d, j < n (strides in bytes, below
; 2^32). With a column stride of 4 bytes (contiguous rows) a row is summed in two chains of
; four float32 lanes (two additions in flight), lane l of chain c over the columns
; j = 8m + 4c + l of the first n - n mod 8 in order of m, then l_i = c0_i + c1_i, then
; (l0 + l1) + (l2 + l3); then (any stride) the products left, in order of j.
;   in: as above, r10 column stride   out: xout   clobbers: rax rdx rdi r8 r11 xmm0-xmm3
matvec_strided:
.row:
        dec     r8d
        js      .done
        xorps   xmm0, xmm0
        xorps   xmm3, xmm3
        xor     r11d, r11d
        cmp     r10d, 4
        jne     .col0
        jmp     .more
.oct:
        movups  xmm1, [rdx+r11*4]
        movups  xmm2, [rsi+r11*4]
        mulps   xmm1, xmm2
        addps   xmm0, xmm1              ; chain 0
        movups  xmm1, [rdx+r11*4+4*MATVEC_LANES]
        movups  xmm2, [rsi+r11*4+4*MATVEC_LANES]
        mulps   xmm1, xmm2
        addps   xmm3, xmm1              ; chain 1
        add     r11d, 2*MATVEC_LANES
.more:
        lea     eax, [r11+2*MATVEC_LANES]
        cmp     eax, ecx
        jbe     .oct
.lanes:
        addps   xmm0, xmm3              ; l
        haddps  xmm0, xmm0              ; l0 + l1, l2 + l3, ..
        haddps  xmm0, xmm0
.col0:
        lea     rax, [rdx+r11*4]        ; W[i*r9 + j*r10] (j = 0 unless the stride is 4)
.col:
        cmp     r11d, ecx
        jae     .store
        movss   xmm1, [rax]
        mulss   xmm1, [rsi+r11*4]
        addss   xmm0, xmm1
        add     rax, r10
        inc     r11d
        jmp     .col
.store:
        movd    eax, xmm0
        stosd
        add     rdx, r9
        jmp     .row
.done:
        ret

; rmsnorm: x (n,), w (n,) -> xout (n,) = x * r * w, r = float32(1 / sqrt(mean(x^2) + eps));
; r8d != 0 adds it to xout instead (Gemma 2/3's post-norm residuals). Sum of squares, mean,
; root and the products (and the sum) in x87 extended precision, rounded once to float32
; (within 1 ulp of transformers' float32 (x * r) * w); xout may be x when not accumulating.
; The squares (exact) go to two sums in turn, from the last: half the chain of dependent adds
; (real 270M prompt 1.03x on 2 threads, where the norms run on one).
;   in: rdi xout, rsi x, rdx w (holds 1 + weight), ecx n, r8d accumulate, xmm0 eps
;   out: xout   clobbers: rax
rmsnorm:
        push    rcx                     ; [rsp]: n, then r; [rsp+4]: eps
        movss   [rsp+4], xmm0
        fldz
        fldz                            ; two sums, the squares in turn (half the latency)
        mov     eax, ecx
.square:
        fld     dword [rsi+rax*4-4]
        fmul    st0, st0
        faddp
        fxch
        dec     eax
        jnz     .square
        faddp
        fidiv   dword [rsp]
        fadd    dword [rsp+4]
        fsqrt
        fld1
        fdivrp
        fstp    dword [rsp]
.scale:
        fld     dword [rsi+rax*4]
        fmul    dword [rsp]
        fmul    dword [rdx+rax*4]
        test    r8d, r8d
        jz      .store
        fadd    dword [rdi+rax*4]
.store:
        fstp    dword [rdi+rax*4]
        inc     eax
        cmp     eax, ecx
        jb      .scale
        pop     rax
        ret

GC_LOG2E = -80                          ; softmax's, geglu's and exp2ps's constants, around
GC_C = -64                              ; gelu_c: each in four lanes (SSE memory operands:
GC_KAPPA = -48                          ; aligned), then p's coefficients c0 = 1 (the last
GC_MAX = -32                            ; lane of GC_ONE) .. c6 as single floats (the table
GC_MIN = -16                            ; sits here, not beside geglu: the place that packs
GC_ONE = 0                              ; smallest)
GC_C0 = GC_ONE + 12
        align   16
        dd      4 dup (1.44269504)      ; log2(e)
        dd      4 dup (-2.3022082)      ; c = -2 sqrt(2/pi) log2(e)
        dd      4 dup (0.044715)        ; kappa
        dd      4 dup (126.0)
        dd      4 dup (-126.0)
gelu_c:
        dd      4 dup (1.0)             ; (c0)
        dd      0.69314718, 0.24022646, 0.055503286     ; c1 .. c6: p(f) ~ 2^f on [-1/2, 1/2]
        dd      0.0096184891, 0.0013399930, 0.00015345792    ; (a relative-error fit)

; softcap: the attention scores' and the logits' soft-cap, x (n,) -> x (n,) in place,
; x[i] = c tanh(s x[i] / c), or s x[i] when c = 0. tanh(z) = 1 - 2 / (e^(2z) + 1): the whole
; in x87 extended precision, rounded once to float32 (s x[i] is not rounded first: within
; 2^-24 |s x[i]| of transformers' float32 steps). e^(2z) overflows to +inf for large z
; (then c), underflows to 0 for very negative z (then -c); NaN stays NaN.
;   in: rdi x, esi n, xmm0 s, xmm1 c (0, or positive and finite)   out: x
;   clobbers: rax rcx (calls exp_x87)
softcap:
        movd    eax, xmm1               ; c's bits: 0 for none
        push    rax                     ; [rsp]: c; aligns rsp for the call
        movss   [rsp+4], xmm0           ; [rsp+4]: s
        fld     dword [rsp]             ; st1 in the loop: c
        mov     ecx, esi
.unit:
        fld     dword [rdi+rcx*4-4]
        fmul    dword [rsp+4]           ; y = s x
        test    eax, eax
        jz      .store
        fdiv    st0, st1                ; z = y / c
        fadd    st0, st0
        call    exp_x87                 ; e^(2z)
        fld1
        faddp
        fdivr   st0, st1                ; c / (e^(2z) + 1)
        fadd    st0, st0
        fsubr   st0, st1                ; c - 2c / (e^(2z) + 1) = c tanh(z)
.store:
        fstp    dword [rdi+rcx*4-4]
        loop    .unit
        fstp    st0
        pop     rax
        ret

; softmax: x (n,) -> x (n,) in place, x[i] = e_i / sum, e_i = 2^y_i by exp2ps, y_i =
; float32((x[i] - max x) log2(e)) (float32 steps, as torch's exp(x - max)), four lanes a pass
; over n rounded up to 4 (x has room for them; the lanes past n are computed and left there);
; the sum of the e_i in x87 extended precision, then each e_i times 1 / sum rounded once.
; Every result within (7.8 + 1.6 (|y_i| + ybar)) u relative of the exact value (u = 2^-24;
; |y| scales the roundings before exp2ps; ybar = sum |y_j| x[j], as the sum carries its
; terms' errors), plus 2^-126 where it is below that (y clamped at -126). x finite.
;   in: rdi x, esi n   out: x   clobbers: rax rcx rdx xmm0-xmm4
softmax:
        movss   xmm0, [rdi]
        mov     ecx, esi
.max:
        maxss   xmm0, [rdi+rcx*4-4]
        loop    .max
        shufps  xmm0, xmm0, 0           ; max in every lane
        lea     rdx, [gelu_c]
        push    rax                     ; aligns rsp for the calls
.exp:                                   ; (ecx = 0)
        movups  xmm1, [rdi+rcx*4]
        subps   xmm1, xmm0
        mulps   xmm1, [rdx+GC_LOG2E]    ; y
        call    exp2ps
        movups  [rdi+rcx*4], xmm2       ; e
        add     ecx, 4
        cmp     ecx, esi
        jb      .exp
        fldz                            ; sum
        mov     ecx, esi
.sum:
        fadd    dword [rdi+rcx*4-4]
        loop    .sum
        fld1
        fdivrp                          ; 1 / sum
        mov     ecx, esi
.divide:
        fld     dword [rdi+rcx*4-4]
        fmul    st0, st1
        fstp    dword [rdi+rcx*4-4]
        loop    .divide
        fstp    st0
        pop     rax
        ret

; geglu: hb (n,), hb2 (n,) -> hb (n,) = gelu_tanh(hb) * hb2 in float32 arithmetic, as torch's:
; gelu_tanh(z) = 0.5 z (1 + tanh(u)) = z / (1 + exp(-2u)), u = sqrt(2/pi) (z + 0.044715 z^3);
; exp(-2u) = 2^y, y = z (1 + kappa z^2) c, c = float32(-2 sqrt(2/pi) log2(e)), kappa = float32
; 0.044715, y clamped to [-126, 126]; 2^y = p(f) 2^n, n = round(y), f = y - n (exact) in
; [-1/2, 1/2], p of degree 6 (within 1.7 ulp of 2^f). Error below 4 u |z hb2| (u = 2^-24; y's
; rounding makes it grow with |y| relative to tiny results, as torch's); z = 0 gives 0.
; Four values a pass, one per lane of the SSE registers, each lane the same operations in the
; same order (so a value's bits do not depend on its neighbours); n a multiple of 4 and hb2
; 16-byte aligned (the header check: ffn is a multiple of 4; mm_share's chunks start at
; multiples of 4 rows of page-aligned buffers).
;   in: rdi hb, rsi hb2, edx n (4, 8, ...)   out: hb   clobbers: rax rcx rdx xmm0-xmm4
geglu:
        push    rax                     ; aligns rsp for the calls
        mov     ecx, edx
        lea     rdx, [gelu_c]
.unit:
        movups  xmm0, [rdi+rcx*4-16]    ; z
        movaps  xmm1, xmm0
        mulps   xmm1, xmm0
        mulps   xmm1, [rdx+GC_KAPPA]
        addps   xmm1, [rdx+GC_ONE]
        mulps   xmm1, xmm0              ; z (1 + kappa z^2)
        mulps   xmm1, [rdx+GC_C]        ; y
        call    exp2ps                  ; 2^y
        addps   xmm2, [rdx+GC_ONE]
        divps   xmm0, xmm2              ; gelu_tanh(z)
        mulps   xmm0, [rsi+rcx*4-16]
        movups  [rdi+rcx*4-16], xmm0
        sub     ecx, 4
        jnz     .unit
        pop     rax
        ret
; exp2ps: 2^y in each lane, y clamped to [-126, 126]: p(f) 2^n, n = round(y), f = y - n
; (exact) in [-1/2, 1/2], p of degree 6 within 1.7 ulp of 2^f; the same operations in every
; lane (geglu's and softmax's exponentials).
;   in: xmm1 y, rdx gelu_c   out: xmm2 2^y   clobbers: rax xmm1 xmm3 xmm4
exp2ps:
        minps   xmm1, [rdx+GC_MAX]
        maxps   xmm1, [rdx+GC_MIN]
        cvtps2dq xmm3, xmm1             ; n (MXCSR: to nearest)
        cvtdq2ps xmm2, xmm3
        subps   xmm1, xmm2              ; f
        pslld   xmm3, 23
        paddd   xmm3, [rdx+GC_ONE]      ; + 1.0's bits: n + 127 in the exponent: 2^n
        push    6
        pop     rax                     ; c6 .. c0 (as scalars from GC_C0)
        xorps   xmm2, xmm2
.horner:
        mulps   xmm2, xmm1
        movss   xmm4, [rdx+rax*4+GC_C0]
        shufps  xmm4, xmm4, 0
        addps   xmm2, xmm4
        dec     eax
        jns     .horner
        mulps   xmm2, xmm3              ; 2^y
        ret

; matmul_q8: matmul_f16's product with W in Q8_0 blocks (n a multiple of 32; x 16-byte
; aligned): a block is an FP16 scale d then 32 int8 q; each weight d q is exact in float32
; (11 by 8 significant bits), then the same float32 operations as matmul_f16, lane for lane:
; its results are matmul_f16's on those weights, bit for bit.
; dequant_q8: xout (d,) = (d_b q_i) s, the first d weights of the Q8_0 row W times the scalar
; at rsi, each rounded once (as matmul_f16 gives for an FP16 (d,1) column by [s]: an
; embedding row); ecx = 1 (that call's n) tells it from matmul_q8.
;   in: rdi xout, rsi x, rdx W (rows of n/32 blocks of 34 bytes), ecx n, r8d d, r9d accumulate
;   out: xout   clobbers: rax rcx rdx rdi r8 r10 r11 xmm0-xmm7
dequant_q8:
        lea     r10, [matmul_q8.deq]
        jmp     matmul_f16.setup
matmul_q8:
        lea     r10, [.col]
        jmp     matmul_f16.setup
.deq:
        movss   xmm2, [rsi]
        shufps  xmm2, xmm2, 0           ; s in every lane
.col:                                   ; xmm1, xmm3: the weights of columns j .. j+7
        test    al, QK8_0-1
        jnz     .q
        movd    xmm5, [rdx]             ; a block's start: d, then its first two q
        pslld   xmm5, 16                ; d in the upper half: as matmul_f16's halves
        psrad   xmm5, 3
        andps   xmm5, xmm6
        mulps   xmm5, xmm7
        shufps  xmm5, xmm5, 0           ; d in every lane
        add     rdx, 2
.q:
        pmovsxbd xmm1, [rdx]
        pmovsxbd xmm3, [rdx+4]
        add     rdx, 8
        cvtdq2ps xmm1, xmm1
        cvtdq2ps xmm3, xmm3
        mulps   xmm1, xmm5              ; d q: exact
        mulps   xmm3, xmm5
        cmp     cl, 1                   ; dequant_q8 (n of a product: a multiple of 32)
        je      .d8
        mulps   xmm1, [rsi+rax*4]
        mulps   xmm3, [rsi+rax*4+16]
        addps   xmm0, xmm1
        addps   xmm4, xmm3
        add     eax, 8
        cmp     eax, ecx
        jb      .col
        jmp     matmul_f16.sum
.d8:
        mulps   xmm1, xmm2
        mulps   xmm3, xmm2
        movups  [rdi+rax*4], xmm1
        movups  [rdi+rax*4+16], xmm3
        add     eax, 8
        cmp     eax, r8d
        jb      .col
        ret

; rope: rotate each of the n_heads heads of x (n_heads, hd), then each of the n2 heads of x2
; (n2, hd), by position pos, half-split pairs (i, i + hd/2) as transformers in float32:
; a = float32(pos * f[i]), f the layer's hd/2 inverse frequencies (the model file's `rope`
; tensor); c, s = float32 cos a, sin a (x87 fsincos), once per pair for the heads of both (a
; token's q and k: half the fsincos of a call each); x[i] = x[i] c - x[i+hd/2] s,
; x[i+hd/2] = x[i+hd/2] c + x[i] s (each product rounded; the four products in the lanes of
; one register, then one hsubps and one haddps); the pairs last first, each on its own. Any f
; is harmless: beyond fsincos's range (|a| >= 2^63, inf, NaN) the results are garbage or NaN,
; the x87 stack stays balanced in effect (all its registers empty again).
;   in: rdi x, esi n_heads (>= 1), edx hd (even), ecx pos, r8 f, r9 x2; stack: n2 (low dword;
;   0: no x2)
;   out: x, x2   clobbers: rax rdx r10 xmm0-xmm2
rope:
        add     edx, edx                ; 2hd: bytes of hd/2 floats
        push    rcx                     ; [rsp]: pos; [rsp-8]: scratch float32s (the red zone:
        lea     eax, [rdx-4]            ; dead before each call); 4i, the last pair first
.pair:
        fld     dword [r8+rax]          ; f
        fimul   dword [rsp]             ; pos f, exact
        fstp    dword [rsp-8]
        fld     dword [rsp-8]           ; a
        fsincos
        fstp    dword [rsp-8]           ; cos a
        fstp    dword [rsp-4]           ; sin a
        movq    xmm2, [rsp-8]
        movlhps xmm2, xmm2              ; c, s, c, s
        lea     rcx, [rdi+rax]          ; x[i] of head 0
        mov     r10d, esi
        call    .heads
        lea     rcx, [r9+rax]           ; x2[i] of its head 0
        mov     r10d, [rsp+16]          ; n2
        test    r10d, r10d
        jz      .next                   ; (none)
        call    .heads
.next:
        sub     eax, 4
        jns     .pair
        pop     rcx
        ret
.heads:                                 ; pair i of r10d heads from rcx on
        movss   xmm0, [rcx]             ; x0
        insertps xmm0, [rcx+rdx], 0x10  ; x1 in lane 1
        shufps  xmm0, xmm0, 0x14        ; x0, x1, x1, x0
        mulps   xmm0, xmm2              ; x0 c, x1 s, x1 c, x0 s
        movhlps xmm1, xmm0              ; x1 c, x0 s
        hsubps  xmm0, xmm0              ; x0 c - x1 s
        haddps  xmm1, xmm1              ; x1 c + x0 s
        movss   [rcx], xmm0
        movss   [rcx+rdx], xmm1
        lea     rcx, [rcx+rdx*2]        ; the next head's
        dec     r10d
        jnz     .heads
        ret
