// wirl-world: code-runner-plugin
// wirl-c-interpreter: lua-src lua-5.4.8
/* wirl's Lua code runner: Lua 5.4 (the reference C interpreter) inside a component, one
 * untrusted program per instance, answering as `lua program.lua` would.
 *
 * The host makes a fresh instance for every program and enforces time, memory, fuel and
 * output from outside the interpreter; this file only gives the program its standard input
 * and arguments, runs it and reports its exit status: 0 at its end, `os.exit`'s status, or
 * 1 for an error (printed as `lua: MESSAGE` and a traceback, on stderr, like `lua` does).
 *
 * Lua's errors unwind with setjmp/longjmp, which the compiler lowers to WebAssembly
 * exceptions (sjlj.c is the runtime half). What Lua offers beyond a pure computation meets
 * WASI's walls: files only in the run's own directory, no processes (`os.execute` and
 * `io.popen` fail as on a system without a shell), no C modules. Chunks are loaded as text
 * only: precompiled bytecode is the one way a Lua program can corrupt its interpreter.
 */
#define _GNU_SOURCE /* fopencookie */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>

#include "code_runner_plugin.h"
#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"

#define UNSUPPORTED_LANGUAGE 127
#define CHUNK_NAME "@program.lua"

/* `os.exit` jumps here, past any `pcall` of the program's, with its status. */
static jmp_buf exit_point;
static int exit_status;

/* Standard input: the program's stdin bytes as a read-only FILE. */
typedef struct {
    const char *bytes;
    size_t len, at;
} input_cursor;

static ssize_t input_read(void *cookie, char *buf, size_t size) {
    input_cursor *cursor = cookie;
    size_t left = cursor->len - cursor->at;
    size_t n = size < left ? size : left;
    memcpy(buf, cursor->bytes + cursor->at, n);
    cursor->at += n;
    return (ssize_t)n;
}

static int stream_noclose(lua_State *L) {
    luaL_Stream *stream = luaL_checkudata(L, 1, LUA_FILEHANDLE);
    stream->closef = &stream_noclose; /* stays open, as Lua's own standard files do */
    luaL_pushfail(L);
    lua_pushliteral(L, "cannot close standard file");
    return 2;
}

/* Make `file` Lua's `io.stdin` and the default input of `io.read` and `io.lines`. */
static void set_stdin(lua_State *L, FILE *file) {
    luaL_Stream *stream = (luaL_Stream *)lua_newuserdatauv(L, sizeof(luaL_Stream), 0);
    stream->f = file;
    stream->closef = &stream_noclose;
    luaL_setmetatable(L, LUA_FILEHANDLE);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, "_IO_input"); /* liolib's key for io.input() */
    lua_getglobal(L, "io");
    lua_insert(L, -2);
    lua_setfield(L, -2, "stdin");
    lua_pop(L, 1);
}

/* os.exit([code [, close]]): `true` or none is 0, `false` is 1, a number is itself. */
static int os_exit(lua_State *L) {
    int status;
    if (lua_isboolean(L, 1))
        status = lua_toboolean(L, 1) ? EXIT_SUCCESS : EXIT_FAILURE;
    else
        status = (int)luaL_optinteger(L, 1, EXIT_SUCCESS);
    exit_status = status;
    longjmp(exit_point, 1);
    return 0;
}

/* The error as `lua` reports it: the message (or what __tostring makes of it), then the
 * traceback of where it was raised. */
static int message_handler(lua_State *L) {
    const char *message = lua_tostring(L, 1);
    if (message == NULL) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
        message = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, message, 1);
    return 1;
}

/* What the program sees before it starts: `arg` as `lua` sets it, text-only `load`, and
 * this runner's `os.exit`. */
static const char PRELUDE[] = "local load0 = load\n"
                              "load = function(chunk, name, mode, ...) return load0(chunk, name, 't', ...) end\n"
                              "local loadfile0 = loadfile\n"
                              "loadfile = function(name, mode, ...) return loadfile0(name, 't', ...) end\n"
                              "dofile = function(name)\n"
                              "  local chunk = assert(loadfile0(name, 't'))\n"
                              "  return chunk()\n"
                              "end\n";

static void prepare(lua_State *L, const exports_wirl_rl_code_runner_program_t *program) {
    luaL_openlibs(L);
    lua_getglobal(L, "os");
    lua_pushcfunction(L, os_exit);
    lua_setfield(L, -2, "exit");
    lua_pop(L, 1);
    lua_createtable(L, (int)program->args.len, 1);
    lua_pushliteral(L, "program.lua");
    lua_rawseti(L, -2, 0);
    for (size_t i = 0; i < program->args.len; i++) {
        lua_pushlstring(L, (const char *)program->args.ptr[i].ptr, program->args.ptr[i].len);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    lua_setglobal(L, "arg");
    if (luaL_loadbufferx(L, PRELUDE, sizeof PRELUDE - 1, "=prelude", "t") != LUA_OK || lua_pcall(L, 0, 0, 0) != LUA_OK)
        abort(); /* the runner's own text: a failure here is a bug of this file */
}

/* Run the program; its exit status. */
static int run(lua_State *L, const exports_wirl_rl_code_runner_program_t *program) {
    lua_pushcfunction(L, message_handler);
    int status = luaL_loadbufferx(L, (const char *)program->source.ptr, program->source.len, CHUNK_NAME, "t");
    if (status == LUA_OK) {
        /* The script's arguments, as `lua program.lua a b` passes them to the main chunk. */
        for (size_t i = 0; i < program->args.len; i++)
            lua_pushlstring(L, (const char *)program->args.ptr[i].ptr, program->args.ptr[i].len);
        status = lua_pcall(L, (int)program->args.len, 0, 1);
    }
    if (status == LUA_OK) return EXIT_SUCCESS;
    const char *message = lua_tostring(L, -1);
    fflush(stdout);
    fprintf(stderr, "lua: %s\n", message ? message : "(error object is not a string)");
    return EXIT_FAILURE;
}

/* `io.tmpfile`: WASI has no temporary files (built with -Dtmpfile=no_tmpfile). */
FILE *no_tmpfile(void) {
    errno = ENOTSUP;
    return NULL;
}

static bool speaks(const code_runner_plugin_string_t *language) {
    static const char *const names[] = {"lua", "lua5.4", "lua54"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t n = strlen(names[i]);
        if (language->len != n) continue;
        bool same = true;
        for (size_t j = 0; j < n && same; j++) {
            char c = (char)language->ptr[j];
            if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
            same = c == names[i][j];
        }
        if (same) return true;
    }
    return false;
}

static void exited(exports_wirl_rl_code_runner_outcome_t *ret, int status, const char *stderr_text) {
    memset(ret, 0, sizeof *ret);
    ret->termination.tag = EXPORTS_WIRL_RL_CODE_RUNNER_TERMINATION_EXITED;
    ret->termination.val.exited = status;
    code_runner_plugin_string_dup(&ret->stdout_, "");
    code_runner_plugin_string_dup(&ret->stderr_, stderr_text);
}

void exports_wirl_rl_code_runner_run(exports_wirl_rl_code_runner_program_t *program,
                                     exports_wirl_rl_code_runner_limits_t *limits,
                                     exports_wirl_rl_code_runner_outcome_t *ret) {
    (void)limits; /* enforced by the host, from outside */
    if (!speaks(&program->language)) {
        char message[160];
        snprintf(message, sizeof message, "this runner speaks lua, not '%.*s'\n",
                 (int)(program->language.len > 64 ? 64 : program->language.len), (const char *)program->language.ptr);
        exited(ret, UNSUPPORTED_LANGUAGE, message);
        return;
    }
    static char out_buffer[1 << 16];
    setvbuf(stdout, out_buffer, _IOFBF, sizeof out_buffer);
    input_cursor cursor = {(const char *)program->stdin_.ptr, program->stdin_.len, 0};
    FILE *input = fopencookie(&cursor, "r", (cookie_io_functions_t){.read = input_read});
    lua_State *L = luaL_newstate();
    int status;
    if (L == NULL || input == NULL) {
        fputs("lua: not enough memory\n", stderr);
        status = EXIT_FAILURE;
    } else if (setjmp(exit_point) == 0) {
        prepare(L, program);
        set_stdin(L, input);
        status = run(L, program);
    } else {
        status = exit_status; /* os.exit */
    }
    fflush(stdout);
    fflush(stderr);
    exited(ret, status, "");
}
