; tokenizer.asm: the prompt's token ids (docs/gemma.md "The tokenizer", docs/format.md
; "Tokenizer (version 3)", the twin of builder/twins/tokenizer.py step for step). The user
; pieces cut the text into segments, which BPE never merges across; each segment is split into
; symbols (UTF-8 characters), merged as sentencepiece's BPE merges them (a binary heap of
; candidate pairs), by the joined piece's score or, with the header flag MERGES, by the merge
; record of the two ids (merge-rank BPE), and turned into ids before the next one is read, so
; that a prompt too long for the context is refused as soon as its ids are more than the
; context holds.

; A symbol record, per segment from r14 on (the next segment reuses them). The segment's
; symbols tile it; a symbol merged into its left neighbour keeps length 0. After the last
; symbol, the segment's end record: the user piece that ends it, or the text's end.
SYM             = 32
SYM_NEXT        = 0             ; u64 -> the next symbol's record; the end record: 0
SYM_START       = 8             ; u64 address of its first byte; the end record: where the next
                                ; segment starts
SYM_PREV        = 16            ; u64 -> the previous symbol's record (0: the first)
SYM_LEN         = 24            ; u32 its bytes (0: merged); the end record: the user piece's
                                ; (>= 1), or 1 at the text's end (so no pair is ever valid with it)
SYM_ID          = 28            ; u32 its id: its normal piece's, or the id its pair merged
                                ; into, or -1 (none); the end record: the user piece's id, or -1
                                ; at the text's end

; A candidate pair: an entry of the heap (from r15 on; the entry that goes first at r15, the
; children of entry i at 2i + 1 and 2i + 2).
CAND            = 16
CAND_SCORE      = 0             ; f32 the score of the normal piece the pair's bytes are, or
                                ; (MERGES) of the merge record of the pair's ids
CAND_LEN        = 4             ; u32 the pair's bytes when it was pushed (it is stale once
                                ; either symbol has changed)
CAND_LEFT       = 8             ; u64 -> its left symbol's record

; The first-byte index of the user table: FIRST_BYTES + 2 dwords of offsets (the user pieces
; starting with byte b are the ids at offsets [X[b], X[b+1]) of the list), then the list: the
; user ids bucketed by their first byte, in the table's order (longest first) in each bucket.
FIRST_BYTES     = 256
FIRST_INDEX     = (FIRST_BYTES + 2) * 4         ; bytes before the list

; tokenize: spaces -> U+2581 (with MERGES: only outside user pieces, which match the raw
; text); at each position the first piece of the user table that matches there (tried through
; the first-byte index) ends a segment and becomes one id; in a segment, one symbol per UTF-8
; character, starting as the id of its normal piece (or -1), merged as sentencepiece's BPE
; does: a heap of the adjacent pairs that merge (pair), the highest score first, the leftmost
; on equal scores, an entry whose symbols have changed since it was pushed skipped; then each
; symbol -> its id, or one byte piece per byte.
;   in: rbx header, rbp front_base, opt_prompt (the text), pending (an id that goes first,
;   or < 0: none; main.asm: BOS), r15d = the position of the first id
;   out: r12 -> ids, the first at [r12 + 4 r15] (room up to ctx_len), r13d = r15 + their
;   count, r15 kept   clobbers: rax rcx rdx rsi rdi r8-r11 r14 xmm0 xmm1
;   (fatal "prompt too long" for r13d > ctx_len: at once when the text alone proves it, more
;   bytes than ctx_len * max_piece_len, else once the segments so far give more; --tokens
;   raised ctx_len by 2^24 for this call, main.asm's setup: past any context)
tokenize:
        push    r15                     ; (the position, for the end)
        mov     rsi, [rbp+V_PROMPT]     ; (never 0: main.asm's start sets an empty default)
        push    rsi
        pop     rdi
        xor     eax, eax
        or      ecx, -1
        repne   scasb                   ; ecx = -(length + 2) (< 2^24 bytes: argv, read_prompt)
        push    rsi
        imul    r14d, ecx, -3
        add     r14d, [rbp+V_CTX_LEN]   ; n3 = 3 * length + 6 + ctx_len: text, 3 zero bytes
        imul    edi, r14d, 5            ; text [n3 bytes] | ids [4 * n3]
        call    alloc
        pop     rsi
        xchg    rax, rdi                ; rdi = text
        lea     r12, [rdi+r14]          ; ids
        push    rdi
.normalise:
        lodsb
        cmp     al, ' '
        jne     .copy
        test    byte [rbx+HDR_FLAGS], FLAG_MERGES
        jnz     .copy                   ; (symbol_piece makes a space symbol U+2581)
space_piece = $ + 1                     ; (symbol_piece: the piece of a space, these bytes)
        mov     eax, 0x8196E2           ; U+2581 = E2 96 81
        stosw
        shr     eax, 16                 ; (al = 0x81)
.copy:
        stosb
        test    al, al
        jnz     .normalise
        lea     r14, [rdi-1]            ; the text's end
        pop     r15                     ; its start
        mov     ecx, r14d
        sub     ecx, r15d               ; its length
        mov     eax, [rbx+HDR_MAX_PIECE_LEN]
        mul     dword [rbp+V_CTX_LEN]
        jc      .fits                   ; the product is 2^32 or more (> length)
        cmp     ecx, eax
        ja      .err_long_prompt        ; before anything that takes time
.fits:
        ; the memo of lookups, symbol records for the length's symbols and an end record, the
        ; heap (at most twice as many entries: each pop that merges pushes two), the
        ; first-byte index
        push    r14                     ; [rsp+16] the text's end
        inc     ecx
        shl     ecx, 5                  ; (length + 1) * SYM (< 2^31)
        mov     r13d, ecx               ; = the heap's bytes: 2 * (length + 1) * CAND
        mov     eax, [rbx+HDR_N_USER]
        lea     rdi, [rax*4+FIRST_INDEX]
        lea     rdi, [rdi+rcx*2]
        call    alloc
        xchg    r14, rax                ; r14 -> the symbol records
        lea     r8, [r14+r13*2]         ; the first-byte index
        add     r13, r14                ; the heap (r14 a mapping's start: a multiple of SYM)
        push    r8                      ; [rsp+8] the first-byte index

; The first-byte index, in two passes over the user ids (r9 -> X + 8, then X + 4): count each
; first byte at X[b + 2], sum up (X[b + 1] = the start of b's bucket), then file each id at
; X[b + 1] and move it on (to the start of b + 1's). The first pass's stores land inside the
; list (each bucket's count so far is < n_user) and the second pass overwrites every one.
        lea     r9, [r8+8]
.pass:
        mov     rsi, [rbp+V_USER]
        mov     edx, [rbx+HDR_N_USER]
.user_id:
        sub     edx, 1
        jb      .passed
        lodsd
        call    piece                   ; rdi -> its bytes (at least one: load_model)
        movzx   ecx, byte [rdi]
        mov     edi, [r9+rcx*4]         ; (the second pass: its place, the next free one)
        inc     dword [r9+rcx*4]
        mov     [r8+rdi*4+FIRST_INDEX], eax
        jmp     .user_id
.passed:
        sub     r9, 4
        cmp     r9, r8
        je      .filed
        xor     eax, eax
        mov     ecx, FIRST_BYTES + 2
        mov     rdi, r8
.sum:
        add     eax, [rdi]
        stosd
        loop    .sum
        jmp     .pass
.filed:
        imul    eax, [rsp+16], 4        ; the position's bytes
        mov     rdi, r12
        sub     r12, rax                ; [r12 + 4 position] = the first id
        mov     eax, [rbp+V_PENDING]
        test    eax, eax
        js      .first_done             ; none
        stosd
.first_done:
        push    rdi                     ; [rsp] -> the next id (rsp 16-aligned for the calls)
        mov     rsi, r15                ; the text's start
        mov     r15, r13                ; r15 -> the heap

; A segment: rsi -> its first byte, r8 -> the record to fill. Each record points to its
; neighbours (set as the next one starts; the end record's next is cleared at the end; the
; first's previous stays 0, as the mapping came: nothing else writes it) and holds its normal
; piece's id (symbol_piece: a space left by MERGES becomes the symbol U+2581). Once a symbol
; has its next, the pair it ends goes onto the heap (add_pair: left to right, as sentencepiece
; pushes them; r13 -> the heap's end).
.segment:
        mov     r8, r14
        mov     r13, r15
        jmp     .symbol
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
        lea     rax, [rsi+rdx]
        push    rax                     ; the next character
        mov     rdi, r8
        call    symbol_piece            ; its length and id
        lea     r8, [rdi+SYM]
        mov     [rdi+SYM_ID], eax
        mov     [rdi+SYM_NEXT], r8
        mov     [r8+SYM_PREV], rdi
        push    r8
        mov     rdi, [rdi+SYM_PREV]
        call    add_pair                ; (the previous one, this one)
        pop     r8
        pop     rsi
.symbol:
        mov     [r8+SYM_START], rsi
        mov     rdx, [rsp+16]
        sub     edx, esi                ; bytes left
        jz      .text_end
        mov     rax, [rsp+8]            ; the user pieces that start with this byte:
        movzx   ecx, byte [rsi]
        mov     r9d, [rax+rcx*4]
        mov     r10d, [rax+rcx*4+4]
        sub     r10d, r9d                       ; r10d = their count
        lea     r9, [rax+r9*4+FIRST_INDEX]      ; r9 -> the first id
.user:
        sub     r10d, 1
        jb      .character
        mov     eax, [r9]
        add     r9, 4
        call    piece
        cmp     ecx, edx
        ja      .user                   ; longer than the text left
        mov     r11b, [rdi+rcx-1]       ; the last bytes first: most pieces that share the
        cmp     r11b, [rsi+rcx-1]       ; first byte end in another (Gemma 3: 6,321 start
        jne     .user                   ; with `<`), and a `repe cmpsb` costs its start-up
        push    rsi
        repe    cmpsb                   ; ecx >= 1 (load_model)
        pop     rdi
        je      .user_piece             ; rsi is past the piece
        mov     rsi, rdi
        jmp     .user
.user_piece:                            ; eax = its id, rdi -> its first byte
        mov     edx, esi
        sub     edx, edi
        jmp     .ended
.text_end:                              ; (edx = 0)
        or      eax, -1
        inc     edx
.ended:                                 ; r8 -> the end record
        mov     [r8+SYM_LEN], edx
        mov     [r8+SYM_ID], eax
        mov     [r8+SYM_START], rsi
        and     qword [r8+SYM_NEXT], 0

; Merging (sentencepiece's bpe_model.cc), every adjacent pair that merges on the heap: pop
; the pair that goes first (pop_top); skip it if stale, else merge it (the merged symbol takes
; the pair's id) and push the merged symbol's pairs with its neighbours. r13 -> the heap's end.
.merge:
        cmp     r13, r15
        je      .emit
        call    pop_top                 ; rdi -> the left symbol, edx = the pair's length
        cmp     dword [rdi+SYM_LEN], 0
        je      .merge                  ; merged into its own left neighbour since: stale
        push    rdx
        call    pair
        pop     rcx
        cmp     edx, ecx
        jne     .merge                  ; either symbol has grown since: stale
        mov     [rdi+SYM_LEN], edx      ; the right symbol joins the left one
        mov     [rdi+SYM_ID], eax
        mov     rcx, [rdi+SYM_NEXT]
        and     dword [rcx+SYM_LEN], 0
        mov     rax, [rcx+SYM_NEXT]
        mov     [rdi+SYM_NEXT], rax
        mov     [rax+SYM_PREV], rdi
        call    add_pair                ; (merged, next)
        mov     rdi, [rdi+SYM_PREV]
        call    add_pair                ; (previous, merged)
        jmp     .merge

; The segment's ids: each symbol's, or its bytes' byte pieces; then the user piece's. r8 ->
; a record, rdi -> the next id.
.emit:
        mov     rdi, [rsp]
        mov     r8, r14
.emit_symbol:
        mov     rsi, [r8+SYM_START]
        mov     edx, [r8+SYM_LEN]
        mov     eax, [r8+SYM_ID]
        test    eax, eax
        jns     .store                  ; (the end record: the user piece's)
        cmp     qword [r8+SYM_NEXT], 0
        je      .check                  ; the end record at the text's end
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
        mov     r8, [r8+SYM_NEXT]
        test    r8, r8
        jnz     .emit_symbol            ; else rsi -> where the next segment starts
.check:                                 ; the ids so far must fit in the context
        mov     [rsp], rdi
        mov     r13, rdi
        sub     r13, r12
        shr     r13, 2
        cmp     r13d, [rbp+V_CTX_LEN]
        ja      .err_long_prompt
        test    eax, eax
        jns     .segment
        add     rsp, 24
        pop     r15
        ret

.err_long_prompt:
        call    fatal_here
        db      'prompt too long', 0

; no_nul: refuse a text that holds a NUL byte before its end ("NUL in prompt"; in a
; conversation's turn: that turn, fatal_here).
;   in: rdi the text, rsi its end (a zero byte there)   out: -   clobbers: rax rcx rdi
no_nul:
        xor     eax, eax
        mov     ecx, esi
        sub     ecx, edi
        inc     ecx                     ; its bytes and the end's zero (< 2^25)
        repne   scasb
        jrcxz   .ret                    ; the first zero is the end's
        call    fatal_here
        db      'NUL in prompt', 0
.ret:
        ret

; add_pair: push the pair of symbol rdi and the next one onto the heap when the segment has a
; next one and the two merge (sentencepiece's MaybeAddNewSymbolPair).
;   in: rdi -> a symbol's record, or 0 (none), r13 the heap's end, r15 its start (a multiple
;   of CAND), rbx header, rbp front_base   out: r13 (one entry further when pushed)
;   clobbers: rax rcx rdx rsi r8-r11 xmm0 xmm1
add_pair:
        test    rdi, rdi
        jz      .done
        mov     rax, [rdi+SYM_NEXT]
        cmp     qword [rax+SYM_NEXT], 0
        je      .done                   ; the end record: no pair
        call    pair                    ; edx = the pair's length
        js      .done
        mov     r9, r13                 ; the new entry, last
        add     r13, CAND
        mov     eax, [r11+PIECE_SCORE]
        mov     [r9+CAND_SCORE], eax
        mov     [r9+CAND_LEFT], rdi
        mov     [r9+CAND_LEN], edx
.up:                                    ; r9 -> the entry going up, entry i
        cmp     r9, r15
        je      .done
        lea     r10, [r15+r9-CAND]
        shr     r10, 1
        and     r10, -CAND              ; its parent, entry (i - 1) / 2 (r15: a multiple of CAND)
        call    order
        mov     r9, r10
        jc      .up
.done:
        ret

; pop_top: take the heap's first entry off (the last one to the top, then down to its place).
;   in: r15 -> the heap, r13 its end (not empty)   out: rdi -> the entry's left symbol, edx =
;   its length; r13 one entry less   clobbers: rax r9 r10 xmm0 xmm1
pop_top:
        mov     rdi, [r15+CAND_LEFT]
        mov     edx, [r15+CAND_LEN]
        sub     r13, CAND
        movups  xmm0, [r13]             ; the last entry to the top, then down
        movups  [r15], xmm0
        mov     r10, r15
.down:                                  ; r10 -> the entry going down, entry i
        lea     r9, [r10+r10+CAND]
        sub     r9, r15                 ; its first child, entry 2i + 1
        cmp     r9, r13
        jae     .ret
        push    r10                     ; (before and order are leaves: any rsp will do)
        mov     r10, r9
        add     r9, CAND                ; the second
        cmp     r9, r13
        jae     .one_child              ; (CF clear)
        call    before                  ; the second goes before the first?
.one_child:
        cmovnc  r9, r10                 ; r9 -> the child that goes first (the first on a tie)
        pop     r10
        call    order                   ; swapped when the child goes first
        mov     r10, r9
        jc      .down
.ret:
        ret

; order: swap heap entries r9 and r10 when r9's goes first (before).
;   in: r9, r10 -> entries   out: CF set when swapped   clobbers: rax xmm0 xmm1
order:
        call    before
        jnc     before.done
        movups  xmm0, [r9]
        movups  xmm1, [r10]
        movups  [r9], xmm1
        movups  [r10], xmm0             ; (CF stays set)
        ret

; before: whether heap entry r9 goes before entry r10: a higher score, or the same score and
; a left symbol further left (sentencepiece's SymbolPairComparator); with a NaN score neither
; goes before the other.
;   in: r9, r10 -> entries   out: CF set when it does   clobbers: rax xmm0
before:
        movss   xmm0, [r10+CAND_SCORE]
        ucomiss xmm0, [r9+CAND_SCORE]
        jp      .unordered
        jne     .done                   ; CF: r10's score is the lower
        mov     rax, [r9+CAND_LEFT]
        cmp     rax, [r10+CAND_LEFT]    ; CF: r9's left symbol comes first
.done:
        ret
.unordered:
        cmc                             ; (CF was set)
        ret

; pair: what symbol rdi and the next one merge into: by score, the normal piece their bytes
; are; with MERGES, the merge record (left, right) of their ids, found by a binary search of
; the records (sorted by (left, right); an id -1 is in none).
;   in: rdi -> a symbol's record (its next one: a symbol or the end record), rbx header,
;   rbp front_base   out: edx = the two's length; eax = the merged id, r11 + PIECE_SCORE -> its
;   score and SF clear, or eax = -1 and SF set   clobbers: rcx rsi r8-r10
pair:
        mov     rax, [rdi+SYM_NEXT]
        mov     edx, [rax+SYM_LEN]
        add     edx, [rdi+SYM_LEN]
        mov     rsi, [rdi+SYM_START]
        test    byte [rbx+HDR_FLAGS], FLAG_MERGES
        jz      symbol_piece.bytes
        mov     r8d, [rdi+SYM_ID]       ; the key (r8d, r9d)
        mov     r9d, [rax+SYM_ID]
        mov     rsi, [rbp+V_MERGES]     ; the records that may hold it: rsi, ecx of them
        mov     ecx, [rbx+HDR_N_MERGES]
        jrcxz   .none
.probe:                                 ; the record half-way, or the first of one
        mov     eax, ecx
        shr     eax, 1
        sub     ecx, eax                ; the key is in the last n - half or before it
        shl     eax, MERGE_SHIFT        ; * MERGE_REC
        lea     r11, [rsi+rax]
        cmp     [r11+MERGE_LEFT], r8d
        jne     .decided
        cmp     [r11+MERGE_RIGHT], r9d
        je      .found
.decided:
        cmovb   rsi, r11                ; below the key: it starts there
        test    eax, eax
        jnz     .probe
.none:
        or      eax, -1
        ret
.found:
        add     r11, MERGE_SCORE - PIECE_SCORE  ; (SF clear: an address)
        mov     eax, [r11+MERGE_RESULT-MERGE_SCORE+PIECE_SCORE]
        ret

; symbol_piece: a new symbol's length (edx) into its record, and its normal piece (lookup); a
; symbol that is a space (left only by MERGES) becomes U+2581 (its start and length there).
;   in: rdi -> a symbol's record (its start set), rsi = its start, edx its length, rbx
;   header, rbp front_base   out: as lookup, rsi = its first byte   clobbers: rcx r8-r11
symbol_piece:
        cmp     byte [rsi], ' '
        jne     .sized
        mov     esi, space_piece        ; (the image is below 2^32)
        mov     [rdi+SYM_START], rsi
        mov     dl, 3
.sized:
        mov     [rdi+SYM_LEN], edx
.bytes:                                 ; (pair: the edx bytes from rsi on)
        add     rdx, rsi

; lookup: the normal piece whose bytes equal [rsi, rdx): a binary search in the index (sorted
; by unsigned bytes, a proper prefix first).
;   in: rsi bytes, rdx their end (0 < rdx - rsi < 2^32), rbx header, rbp front_base
;   out: eax id, r11 -> its record and SF clear, or eax = -1 and SF set; edx = the length
;   clobbers: rcx r8-r11
lookup:
        push    rdi
        push    rsi
        sub     edx, esi
        or      r8, -1                  ; lo - 1
        mov     r9d, [rbx+HDR_N_INDEX]  ; hi
.probe:
        lea     r10, [r8+r9+1]
        shr     r10, 1                  ; mid
        or      eax, -1                 ; (none, when lo = hi)
        cmp     r10, r9
        jae     .done
        mov     rax, [rbp+V_INDEX]
        mov     eax, [rax+r10*4]
        call    piece
        mov     rsi, [rsp]
        cmp     ecx, edx
        cmova   ecx, edx                ; the shorter length
        test    ecx, ecx                ; (ZF: an empty piece is a prefix)
        repe    cmpsb
        jne     .decided
        cmp     edx, [r11+PIECE_LEN]    ; equal up to the shorter: the shorter sorts first
        je      .done                   ; (SF clear: an id)
.decided:
        cmova   r8, r10                 ; above: lo = mid + 1
        cmovbe  r9, r10                 ; below: hi = mid
        jmp     .probe
.done:
        pop     rsi
        pop     rdi
        test    eax, eax
        ret
