; math.asm: transcendental functions on the x87 stack (64-bit mantissa), for the kernels.
; Callers round the result to float32 once, so a float32 result is correctly rounded except
; when the exact value lies within the stated error of a rounding boundary.

; exp_x87: st0 = e^x; exp2_x87: st0 = 2^y. y = x*log2(e) in extended precision, n = round(y),
; f = y - n in [-1/2, 1/2], 2^y = (f2xm1(f) + 1) * 2^n (fscale, exact).
;   in: st0 x (finite)   out: st0 e^x (+inf on overflow, 0 on underflow)
;   uses one more x87 register; clobbers nothing else
;   error: relative < 2^-58 for |x| < 128 (x87 hardware); under QEMU's x87 (f2xm1 in double)
;   < 2^-51. Either way <= 0.5 ulp + 2^-27 ulp after rounding to float32.
exp_x87:
        fldl2e
        fmulp
exp2_x87:
        fld     st0
        frndint
        fsub    st1, st0
        fxch
        f2xm1
        fld1
        faddp
        fscale
        fstp    st1
        ret
