; unpack.asm: the decoder of the packed ./gemma. builder/asm/pack.py is its mirror in Python
; (and the packer); docs/build.md "The packed program" explains the model. In short, a
; bitwise context-mixing model drives a range decoder:
; - each of the model's N context models (at most 15) chooses some lanes of a state word (a
;   mask): the byte's x86 field and its instruction's opcode, as the field machine below
;   (`.fields`, pack_fields.py) decides them, and the last six bytes; once per byte it
;   hashes them with its record's offset into a slot base and a 16-bit check; a bit's slot
;   in the shared table is the slot base xor c0 (the bits of the byte so far, after a
;   leading 1). A slot holds two counts, n0 and n1, and the check of its context: a slot
;   with another check belongs to another context and starts again from no counts;
; - P(1) = (sum n1 << shift + PRIOR) / (sum (n0 + n1) << shift + 2 PRIOR) over the models;
; - after each bit its count goes up by one (at most 255) and the other count n becomes
;   n / 2 + 1 (0 stays 0).
; Integers only, so the Python mirror and this routine agree bit for bit on any input.
; The stream holds the field machine's tables, then the image; the table is zeroed between
; them. Last, the call filter: the packer wrote each call rel32 (0xE8, a dword) as its
; target's offset in out, so that calls of one routine repeat; from the last byte whose dword
; is in out down to the first, a byte 0xE8 before a dword below 2^16 gets that dword minus
; its own offset + 5 (pack.py's decode_calls).

PACK_TABLE_BITS = 18                    ; the table: 2^18 slots
PACK_SCRATCH    = 4 shl PACK_TABLE_BITS ; its bytes: a slot is n0, n1, the check (word)
PACK_HASH       = 0x9E3779B97F4A7C15    ; odd: the key times it, mod 2^64, is the hash
PACK_PRIOR      = 2
PACK_CALL       = 0xE8                  ; call rel32: the call filter's opcode
PACK_TABLES     = 4*256 + 0xC8          ; the field machine's tables: out's first bytes
PACK_MODRM_REG  = 0xC7                  ; a ModRM's entry: mod and rm, not reg
PACK_MODRM      = 4                     ; its codes (pack_fields.py): 0..3 an opcode of map
PACK_LOOKUPS    = 5                     ; 0..3, 4 a ModRM (these look their byte up),
PACK_VEXP       = 5                     ; a VEX/EVEX payload byte, the first of VEX3's or
PACK_P0         = 6                     ; EVEX's, ..., 13..15 a 32-bit field's first
PACK_DISP32     = 13                    ; byte (disp, imm, rel), 10..12 its others

; unpack: out (n,) <- the packed bytes at src: the model (a count byte N, then N pairs
; mask, shift) and the range-coded bits of out, each byte's most significant bit first; out
; holds the field machine's tables (PACK_TABLES bytes), then the image.
; Records on the stack, 32 bytes per model i, the first model's highest (the loops walk down
; from it, rbp the record's offset + 32: from 32 N down to 32): [+0] R_i = 0xFF in the lanes (bytes) of rbx the mask chooses (bit k: lane k):
; 0 the byte's field, 1 its opcode, 2..7 the history bytes; [+8] the slot of the
; previous bit; [+16] the check (a word: a new context's slot is its check << 16, no
; counts), [+18] the slot base of the byte's context (a dword); [+24] the shift. rbx holds
; history bytes 0..5 (the last first) in lanes 2..7, c0 in bh and the byte's field in bl;
; when a byte starts, bh is
; the opcode while rbx & R_i plus the record's offset, model i's key, is hashed. The loop over
; the models first teaches each model's previous slot the previous bit (r8 = -bit; the first
; bit's loop teaches slot 0 a 0), then reads its new slot.
; Lookups in the 1 MiB table are the decoder's hot spot, so a line comes early: when a
; byte starts, each model's slots base xor 1..15 (its first four bits: one 64-byte line):
; without it `./gemma -h` starts ~19% slower. (A prefetch of the next bit's line in the
; models' loop too took 12 bytes there and 4 for the bit loop's jump back, far then, for
; ~1.5% of start-up: AMD EPYC, AVX-512 host.)
; The range decoder: r9d range, r10d code (the stream's bytes read so far minus the low end
; of the range), starting at 1 and 0, so that the first bit's renormalisation reads three
; bytes. Above the records: [rsp+r12] out, then the field machine's state: [rsp+r12+8] the
; plan (the codes of the instruction's bytes to come, a nibble each: a dword), [rsp+r12+12]
; the opcode. r13: the end of out.
;   in: rdi out (zero), rsi src, rdx n (>= PACK_TABLES + 1), rcx scratch (PACK_SCRATCH
;   bytes, zero, 4-aligned)
;   out: out, r11 = scratch   clobbers: rax rbx rcx rdx rsi rdi rbp r8-r13 r15 (not
;   SysV: the stub keeps none)
unpack:
        mov     r11, rcx                ; the table
        push    0                       ; the plan (dword), the opcode
        push    rdi                     ; out: the field tables; for the call filter
        lea     r13, [rdx+rdi]          ; the end of out
        lodsb
        movzx   r8d, al                 ; N
        imul    r12d, r8d, 32           ; the records' bytes
.record:
        lodsw                           ; al mask, ah shift
        movzx   edx, ah
        push    rdx                     ; [+24] shift
        push    rdx                     ; [+16] (the check and slot base, per byte)
        push    r11                     ; [+8] slot 0
        push    8
        pop     rcx
.lane:                                  ; mask bit k -> lane k: eight steps, high bit first
        shl     rdx, 8
        shl     al, 1
        sbb     dl, dl
        loop    .lane
        push    rdx                     ; [+0] R_i
        dec     r8d
        jnz     .record
        push    1
        pop     r9                      ; range
        xor     r10d, r10d              ; code
        xor     ebx, ebx                ; no history, field 0 (an opcode of map 0), opcode 0
        mov     r15d, PACK_TABLES       ; bytes until the image
.byte:                                  ; each model's slot base and check for this byte
        mov     ebp, r12d               ; (rbp: the record's offset + 32)
.hash:
        mov     rax, rbx
        and     rax, [rsp+rbp-32]
        lea     rax, [rax+rbp-32]       ; the key
        imul    rax, [PACK_HASH_AT]     ; (PACK_HASH, kept in the headers: stub.asm)
        shr     rax, 64 - PACK_TABLE_BITS - 16  ; the slot base (the hash's top bits) << 16
        mov     [rsp+rbp-16], rax       ; | the check (the 16 bits below them)
        shr     rax, 16
        prefetcht0 [r11+rax*4]          ; the line of the byte's first four bits' slots
        sub     ebp, 32
        jnz     .hash
        mov     bh, 1                   ; c0 = 1
.bit:                                   ; renormalise: below 2^24 the range takes a byte
        mov     eax, r9d
        shr     eax, 24
        jnz     .coded_bit
        shl     r9d, 8
        lodsb
        shl     r10d, 8
        mov     r10b, al
.next_bit:
        jmp     .bit
.coded_bit:                             ; (rsi and rdi kept: esi and edi serve the mix)
        push    rsi
        push    rdi                     ; (the records 16 bytes up from rsp)
        push    PACK_PRIOR              ; num = PRIOR + sum n1 << shift
        pop     rdx
        mov     edi, edx                ; den0 = PRIOR + sum n0 << shift: den = den0 + num
        mov     ebp, r12d
.model:
        mov     rax, [rsp+rbp-24+16]    ; the previous bit's slot
        sub     rax, r8                 ; -> the count of that bit (r8 = -bit)
        add     byte [rax], 1
        sbb     byte [rax], 0           ; at most 255
        xor     al, 1                   ; -> the other count n (slots are 4-aligned)
        mov     cl, [rax]
        shr     byte [rax], 1
        neg     cl
        adc     byte [rax], 0           ; n / 2 + 1, or 0
        mov     eax, [rsp+rbp-14+16]    ; the slot base
        xor     al, bh
        lea     rax, [r11+rax*4]        ; this bit's slot
        mov     [rsp+rbp-24+16], rax
        movzx   esi, word [rsp+rbp-16+16]       ; the check
        cmp     [rax+2], si             ; ZF: the slot holds this context
        mov     ecx, [rax]
        rol     esi, 16                 ; (ZF kept)
        cmovne  ecx, esi                ; or a new one: no counts, its check
        mov     [rax], ecx
        movzx   esi, ch                 ; n1
        movzx   eax, cl                 ; n0
        mov     cl, [rsp+rbp-8+16]
        shl     esi, cl
        add     edx, esi
        shl     eax, cl
        add     edi, eax
        sub     ebp, 32
        jnz     .model
        add     edi, edx                ; den
        xor     eax, eax
        div     edi                     ; p = num 2^32 / den < 2^32
        pop     rdi
        pop     rsi
        mul     r9d                     ; bound = range p / 2^32 < range
        sub     r9d, edx
        mov     eax, r10d
        sub     eax, edx                ; CF: code < bound, a 1
        sbb     r8, r8                  ; -bit (CF kept)
        cmovnc  r10d, eax               ; 0: code -= bound, range -= bound
        cmovc   r9d, edx                ; 1: range = bound
        adc     bh, bh                  ; c0 = 2 c0 + bit; CF: the byte is complete
        jnc     .next_bit               ; (a short jump: .bit is too far)
        movzx   eax, bh
        stosb
        shl     rbx, 8                  ; the byte into lane 2, the oldest one out; bh: its field
.fields:                                ; the field machine (pack_fields.Fields.step): al byte
        lea     rbp, [rsp+r12]          ; [rbp] out, [rbp+8] the plan, [rbp+12] the opcode
        mov     edx, [rbp+8]
        shr     edx, 4                  ; the plan after this byte
        movzx   ecx, bh                 ; the byte's code: below PACK_MODRM an opcode,
        cmp     cl, PACK_MODRM          ; PACK_MODRM a ModRM (both look their entry up:
        jb      .opcode                 ; codes below PACK_LOOKUPS, = PACK_MODRM + 1)
        je      .modrm
        cmp     cl, PACK_P0
        jne     .wide
        and     al, 3                   ; VEX3's or EVEX's first payload byte: a payload
        shl     eax, 4                  ; byte, then an opcode of map al, after the plan
        or      al, PACK_VEXP
        xchg    eax, edx
        jmp     .append
.wide:
        cmp     cl, PACK_DISP32         ; a 32-bit field's first byte (codes PACK_DISP32
        jb      .field                  ; on): three bytes of code - 3 first
        lea     eax, [rcx-3]
        imul    eax, eax, 0x111
        jmp     .append
.modrm:                                 ; a ModRM: its entry, without its reg bits
        and     al, PACK_MODRM_REG
        jmp     .entry
.opcode:                                ; an opcode (of map cl): its entry
        mov     [rbp+12], al            ; the instruction's opcode
.entry:
        mov     ah, cl
        add     rax, [rbp]
        movzx   eax, byte [rax]
.append:                                ; rdx <- the codes of eax (a nibble each), then rdx's
        mov     ecx, eax
.nibble:
        jrcxz   .or                     ; (rcx = ecx)
        shl     edx, 4
        shr     ecx, 4
        jmp     .nibble
.or:
        or      edx, eax
.field:
        mov     [rbp+8], edx
        and     dl, 15
        mov     bl, dl                  ; the next byte's code
        mov     bh, [rbp+12]            ; and its instruction's opcode, for the hashes
.fielded:
        dec     r15d
        jnz     .more
        push    rdi                     ; the field tables decoded: the image starts with
        mov     rdi, r11                ; a zeroed table (what the tables taught would
        bts     ecx, PACK_TABLE_BITS    ; mislead): PACK_SCRATCH / 4 dwords (the tables'
        rep     stosd                   ; last byte, a ModRM of entry 0, left eax and ecx 0
        pop     rdi                     ; in .append)
.more:
        cmp     rdi, r13
        jb      .byte
        add     rsp, r12                ; drop the records
        pop     rcx                     ; out
        pop     rdx                     ; (the machine)
        sub     rdi, 5                  ; the last byte whose dword ends in out (n > 5)
        mov     al, PACK_CALL
        std                             ; (scasb walks down)
.call:                                  ; the call filter, down to out's first byte: a call's
        scasb                           ; target offset (below 2^16) back to its rel32 (rdi:
        jne     .next                   ; the byte before)
        cmp     word [rdi+4], 0
        jne     .next
        lea     edx, [rdi+6]
        sub     edx, ecx                ; the call's end, an offset in out
        sub     [rdi+2], edx
.next:
        cmp     rdi, rcx
        jae     .call
        cld
        ret
