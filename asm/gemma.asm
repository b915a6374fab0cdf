; gemma.asm: the entry file of the engine. It lists the include order and the segments;
; every concern lives in its own file. Builds with `python -m builder` (keystone, verified)
; and with `fasm asm/gemma.asm OUT` (the independent check).
; The order is the packer's: `python -m builder pack --order` (move one file elsewhere,
; keep the smallest ./gemma, again) found this one 39 bytes smaller packed than the order of
; the concerns (sys, format, main, model, tokenizer, sample, output, forward, kernels, math,
; fast, fast512, cpu, threads, text) on 2026-12-04; after GEGLU's four lanes, math.asm after
; sample.asm: 3 bytes more (a pass, 2026-12-04, evening); after Vᵀ att's four chains,
; threads.asm first and sys.asm after cpu.asm: 5 more (two passes, late evening); after
; FP16 decode's prefetch, text.asm first and output.asm before sys.asm: 2 more (two passes,
; night); after the op program's interpreter, program.asm before forward.asm: 11 more (a
; pass, 2026-12-06); after conversation mode, chat.asm before sys.asm, output.asm after
; main.asm, math.asm before sample.asm and threads.asm after forward.asm: 16 more (four passes,
; 2026-12-06; 14.5 on average over 8 shifts of the code before kernels.asm's align);
; docs/build.md.

format ELF64 executable 3
entry start

segment readable executable

include 'cpu.asm'               ; CPUID/XGETBV: which kernel (W-fast)
include 'program.asm'           ; the program's validation and buffers (model_setup)
include 'forward.asm'           ; forward: the op program's interpreter
include 'threads.asm'           ; clone/futex: products split by rows (W-fast)
include 'math.asm'              ; exp, and the rest of the float math
include 'chat.asm'              ; -cnv: turns from stdin in the model's template
include 'sys.asm'               ; the only file that holds `syscall`
include 'format.asm'            ; the model file's layout (constants only)
include 'main.asm'              ; start-up, command line, generation loop
include 'text.asm'              ; read-only strings
include 'model.asm'             ; open, map and validate the model file
include 'output.asm'            ; ids -> text on stdout; --tokens; write_all
include 'tokenizer.asm'         ; text -> ids
include 'sample.asm'            ; logits -> next id
include 'kernels.asm'           ; the neural-net operations
include 'fast.asm'              ; the AVX + FMA + F16C matrix product (W-fast)
include 'fast512.asm'           ; the same with AVX-512F (W-fast)

segment readable writeable

include 'vars.asm'              ; zero-initialised state (bss)
