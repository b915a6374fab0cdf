; tokenizer.asm: the prompt's token ids (docs/gemma.md "The tokenizer", the twin of
; builder/twins/tokenizer.py step for step). A symbol is a run of the normalised text, a record of
; SYM bytes. Symbols are contiguous: symbol j ends where j+1 starts; a sentinel record holds
; the text's end. Each record caches its pair with the next symbol, so that a merge pass is
; a scan and only the two pairs around a merge are looked up again.

SYM             = 24
SYM_PAIR        = 0             ; i32 the pair of this and the next symbol: 1 a normal piece
                                ; (SYM_SCORE valid), -1 none, 0 not looked up yet
SYM_TAG         = 4             ; u32 id of a matched user-defined piece (< 2^24, never merged),
                                ; or -1 (free); the sentinel's is 0 (zeroed memory): not free
SYM_START       = 8             ; u64 address of its first byte in the text
SYM_SCORE       = 16            ; f32 score of the pair's piece

; tokenize: spaces -> U+2581; user-defined pieces (longest first) or one UTF-8 character per
; symbol; merge the adjacent free pair whose bytes are the best-scoring normal piece
; (leftmost on ties) until none is; each symbol -> its id, or one byte piece per byte.
;   in: rbx header, rbp front_base, opt_prompt   out: r12 -> ids (BOS first, room for
;   ctx_len), r13d = their count, r15 = 0 (main.asm's position)
;   clobbers: rax rcx rdx rsi rdi r8-r11 r14 xmm0
;   (fatal "prompt too long" for more ids than ctx_len, or early when the text alone proves
;   it: more bytes than ctx_len * max_piece_len)
tokenize:
        mov     rsi, [rbp+V_PROMPT]     ; (never 0: main.asm's start sets an empty default)
        push    rsi
        pop     rdi
        xor     eax, eax
        or      ecx, -1
        repne   scasb                   ; ecx = -(length + 2) (< 2^24 bytes: argv, read_prompt)
        push    rsi
        imul    r14d, ecx, -3
        add     r14d, [rbp+V_CTX_LEN]   ; n3 = 3 * length + 6 + ctx_len: text, 3 zero bytes
        imul    edi, r14d, 8 + SYM      ; text [n3 bytes] | ids [4 * n3] | ... | symbols [SYM * n3]
        call    alloc                   ; (the record before the symbols is unused memory)
        pop     rsi
        xchg    rax, rdi                ; rdi = text
        lea     r12, [rdi+r14]          ; ids
        lea     r14, [rdi+r14*8]        ; symbols
        push    rdi
.normalise:
        lodsb
        cmp     al, ' '
        jne     .copy
        mov     ax, 0x96E2              ; U+2581 = E2 96 81
        stosw
        mov     al, 0x81
.copy:
        stosb
        test    al, al
        jnz     .normalise
        lea     r10, [rdi-1]            ; text end
        pop     rsi                     ; rsi = position, r13 -> the next symbol
        mov     ecx, r10d
        sub     ecx, esi                ; the text's length
        mov     eax, [rbx+HDR_MAX_PIECE_LEN]
        mul     dword [rbp+V_CTX_LEN]
        jc      .fits                   ; the product is 2^32 or more (> length)
        cmp     ecx, eax
        ja      .err_long_prompt        ; before matching pieces and merging, which take time
.fits:
        mov     r13, r14
        mov     r8, [rbp+V_USER]
.symbol:
        mov     [r13+SYM_START], rsi
        mov     edx, r10d
        sub     edx, esi                ; bytes left
        jz      .symbols_done
        xor     r9d, r9d
.user:
        cmp     r9d, [rbx+HDR_N_USER]
        jae     .character
        mov     eax, [r8+r9*4]
        inc     r9d
        call    piece
        cmp     ecx, edx
        ja      .user
        push    rsi
        repe    cmpsb                   ; ecx >= 1 (load_model)
        pop     rcx
        je      .tagged                 ; rsi is past the piece
        mov     rsi, rcx
        jmp     .user
.character:
        ; UTF-8: the lead byte's leading ones give the length; a byte that does not start a
        ; complete, well-formed sequence is a symbol of its own. The text is followed by zero
        ; bytes, which are not continuation bytes.
        mov     al, [rsi]
        push    -2
        pop     rcx
.lead:
        inc     ecx
        shl     al, 1
        jc      .lead                   ; ecx = the leading ones - 1: continuation bytes
        lea     edx, [rcx+1]            ; the length if they are there
        cmp     ecx, 3
        ja      .single                 ; ASCII (-1), or no lead byte (4 to 7)
.next_byte:
        jrcxz   .whole
        cmp     byte [rsi+rcx], 0xC0    ; 0x80..0xBF: below -64 as a signed byte
        lea     ecx, [rcx-1]
        jl      .next_byte
.single:
        mov     dl, 1                   ; (edx < 256)
.whole:
        or      eax, -1
        add     rsi, rdx
.tagged:
        mov     [r13+SYM_TAG], eax
        add     r13, SYM
        jmp     .symbol
.symbols_done:

; A merge pass: rdi -> symbol j, r15 -> the best pair's left symbol (0: none). A pair is
; looked up when a pass first meets it; merging drops symbol best+1 and marks the two pairs
; the merged symbol is in to be looked up again.
.pass:
        xor     r15d, r15d
        mov     rdi, r14
.pair:
        cmp     rdi, r13
        jae     .pass_done
        cmp     dword [rdi+SYM_PAIR], 0
        jl      .next_pair              ; no pair
        jg      .candidate
        dec     dword [rdi+SYM_PAIR]    ; not looked up yet: -1 unless it is a piece
        mov     eax, [rdi+SYM_TAG]
        and     eax, [rdi+SYM+SYM_TAG]
        jns     .next_pair              ; not both free (tags -1; ids < 2^24)
        mov     rsi, [rdi+SYM_START]
        mov     rdx, [rdi+2*SYM+SYM_START]
        call    lookup
        js      .next_pair
        neg     dword [rdi+SYM_PAIR]
        mov     eax, [r11+PIECE_SCORE]
        mov     [rdi+SYM_SCORE], eax
.candidate:
        test    r15, r15
        jz      .best
        movss   xmm0, [rdi+SYM_SCORE]
        ucomiss xmm0, [r15+SYM_SCORE]
        jbe     .next_pair              ; not higher (or NaN): the leftmost stays
.best:
        mov     r15, rdi
.next_pair:
        add     rdi, SYM
        jmp     .pair
.pass_done:
        test    r15, r15
        jz      .merged                 ; (r15 = 0 from here on: the out value)
        lea     rdi, [r15+SYM]
        lea     rsi, [rdi+SYM]          ; move best+2 .. the sentinel down one
        sub     r13, SYM
        mov     ecx, r13d
        sub     ecx, r15d
        rep     movsb
        mov     [r15+SYM_PAIR-SYM], ecx ; 0 (before the first symbol: the unused record)
        mov     [r15+SYM_PAIR], ecx
        jmp     .pass

.err_long_prompt:
        call    fatal_here
        db      'prompt too long', 0

; Emit: r14 -> symbol, r13 = the sentinel, rdi -> the next id.
.merged:
        mov     rdi, r12
        mov     eax, [rbx+HDR_BOS]
        stosd
.emit:
        cmp     r14, r13
        jae     .emitted
        mov     eax, [r14+SYM_TAG]
        test    eax, eax
        jns     .store                  ; a user-defined piece
        mov     rsi, [r14+SYM_START]
        mov     rdx, [r14+SYM+SYM_START]
        call    lookup
        jns     .store
.byte:
        lodsb                           ; byte fallback: <0xHH> = byte_base + HH
        movzx   eax, al
        add     eax, [rbx+HDR_BYTE_BASE]
        dec     edx
        jz      .store
        stosd
        jmp     .byte
.store:
        stosd
        add     r14, SYM
        jmp     .emit
.emitted:
        sub     rdi, r12
        shr     edi, 2
        mov     r13d, edi
        cmp     edi, [rbp+V_CTX_LEN]
        ja      .err_long_prompt
        ret

; lookup: the normal piece whose bytes equal [rsi, rdx), by binary search in the index
; (sorted by unsigned bytes, a proper prefix first).
;   in: rsi bytes, rdx their end (rdx - rsi < 2^32), rbx header
;   out: eax id, r11 -> its record and SF clear, or eax = -1 and SF set; edx = the length
;   clobbers: rcx r8-r11
lookup:
        sub     edx, esi
        push    rdi
        or      r8, -1                  ; lo - 1
        mov     r9d, [rbx+HDR_N_INDEX]  ; hi
.probe:
        lea     r10, [r8+r9+1]
        shr     r10, 1                  ; mid
        cmp     r10, r9
        jae     .none                   ; lo = hi
        mov     rax, [rbp+V_INDEX]
        mov     eax, [rax+r10*4]
        call    piece
        push    rsi
        cmp     edx, ecx                ; when the shorter length is 0 these flags decide
        cmovb   ecx, edx
        repe    cmpsb
        pop     rsi
        jne     .decided
        cmp     edx, [r11+PIECE_LEN]    ; equal up to the shorter: the shorter sorts first
        je      .found                  ; (SF clear)
.decided:
        cmova   r8, r10                 ; above: lo = mid + 1
        cmovbe  r9, r10                 ; below: hi = mid
        jmp     .probe
.none:
        or      eax, -1                 ; (SF set)
.found:
        pop     rdi
        ret
