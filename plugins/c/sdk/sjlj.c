/* The runtime half of setjmp/longjmp as clang lowers them to WebAssembly exceptions
 * (`-mllvm -wasm-enable-sjlj`): the compiler calls these three, and catches the exception
 * `__wasm_longjmp` throws at each function that called `setjmp`, where it asks
 * `__wasm_setjmp_test` whether that `setjmp` was its own. wasi-libc names them but does not
 * build them into the libc zig ships, so the runner brings its own.
 *
 * The jmp_buf (musl's, 156 bytes or more on wasm32) holds which invocation of which function
 * called `setjmp` (the compiler's `label` and `invocation`), and the value `longjmp` passes,
 * as the exception's payload. */
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>

struct lowered_jmp_buf {
    void *invocation;
    uint32_t label;
    struct {
        void *env;
        int value;
    } thrown;
};

_Static_assert(sizeof(struct lowered_jmp_buf) <= sizeof(jmp_buf), "jmp_buf holds the lowered state");

void __wasm_setjmp(void *env, uint32_t label, void *invocation) {
    struct lowered_jmp_buf *buf = env;
    if (label == 0 || invocation == NULL) abort(); /* the compiler never passes these */
    buf->invocation = invocation;
    buf->label = label;
}

uint32_t __wasm_setjmp_test(void *env, void *invocation) {
    struct lowered_jmp_buf *buf = env;
    return buf->invocation == invocation ? buf->label : 0;
}

void __wasm_longjmp(void *env, int value) {
    struct lowered_jmp_buf *buf = env;
    buf->thrown.env = env;
    buf->thrown.value = value == 0 ? 1 : value; /* longjmp(env, 0) returns 1 from setjmp */
    __builtin_wasm_throw(1 /* the C longjmp tag */, &buf->thrown);
}
