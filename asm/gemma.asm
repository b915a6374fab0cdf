; gemma.asm: the entry file of the engine. It lists the include order and the segments;
; every concern lives in its own file. Builds with `python -m builder` (keystone, verified)
; and with `fasm asm/gemma.asm OUT` (the independent check).

format ELF64 executable 3
entry start

segment readable executable

include 'sys.asm'               ; the only file that holds `syscall`
include 'format.asm'            ; the model file's layout (constants only)
include 'main.asm'              ; start-up, command line, generation loop
include 'model.asm'             ; open, map and validate the model file
include 'tokenizer.asm'         ; text -> ids
include 'sample.asm'            ; logits -> next id
include 'output.asm'            ; ids -> text on stdout; --tokens; write_all
include 'forward.asm'           ; model_setup, forward: the Gemma graph
include 'kernels.asm'           ; the neural-net operations
include 'math.asm'              ; exp, and the rest of the float math
include 'fast.asm'              ; the AVX + FMA + F16C matrix product (W-fast)
include 'fast512.asm'           ; the same with AVX-512F (W-fast)
include 'cpu.asm'               ; CPUID/XGETBV: which kernel (W-fast)
include 'threads.asm'           ; clone/futex: products split by rows (W-fast)
include 'text.asm'              ; read-only strings

segment readable writeable

include 'vars.asm'              ; zero-initialised state (bss)
