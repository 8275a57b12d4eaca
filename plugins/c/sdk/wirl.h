/* Write wirl reward plugins in C.
 *
 *     // wirl-world: reward-plugin
 *     #include "wirl.h"
 *
 *     bool wirl_reward(const wirl_task *task, wirl_str completion, wirl_score *score, char **error) {
 *         if (!task->has_answer) { *error = wirl_printf("task %.*s has no answer", WIRL_FMT(task->id)); return false; }
 *         float correct = wirl_str_contains(completion, task->answer) ? 1.0f : 0.0f;
 *         score->reward = correct;
 *         wirl_part_add(score, "correct", correct);
 *         return true;
 *     }
 *
 * Define `wirl_reward`: fill `*score` and return true, or set `*error` to a malloc'd reason
 * (wirl_printf) and return false when the completion cannot be scored. The SDK converts to
 * and from the WIT types and frees what it allocated. Strings from the host are UTF-8 and
 * not NUL-terminated: use the `wirl_str` helpers or `%.*s` with WIRL_FMT.
 */
#ifndef WIRL_H
#define WIRL_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A UTF-8 string slice; `ptr` may be NULL when `len` is 0. */
typedef struct {
    const char *ptr;
    size_t len;
} wirl_str;

#define WIRL_FMT(s) (int)(s).len, (s).ptr

typedef struct {
    wirl_str id;
    bool has_answer;
    wirl_str answer;
    bool has_metadata;
    wirl_str metadata; /* JSON text */
} wirl_task;

#define WIRL_MAX_PARTS 16

typedef struct {
    const char *name; /* a string literal (not freed) */
    float value;
} wirl_part;

typedef struct {
    float reward;
    wirl_part parts[WIRL_MAX_PARTS];
    size_t n_parts;
    char *note; /* NULL, or malloc'd and NUL-terminated: the SDK frees it */
} wirl_score;

/* The plugin's reward. */
bool wirl_reward(const wirl_task *task, wirl_str completion, wirl_score *score, char **error);

/* Add a named part (at most WIRL_MAX_PARTS). */
void wirl_part_add(wirl_score *score, const char *name, float value);

/* printf into a malloc'd string. */
char *wirl_printf(const char *format, ...);

/* The plugin's setting `key` as a number: `fallback` when absent; false (and *error) when
 * it is not a number. */
bool wirl_config_number(const char *key, double fallback, double *out, char **error);

/* Text as Rust's `str` methods see it (Unicode whitespace, full lowercase mapping). */
wirl_str wirl_str_trim(wirl_str s);
bool wirl_str_equal(wirl_str a, wirl_str b);
bool wirl_str_contains(wirl_str haystack, wirl_str needle);
/* The first `max_chars` characters. */
wirl_str wirl_str_prefix_chars(wirl_str s, size_t max_chars);
/* Unicode lowercase (with the final-sigma rule), malloc'd; its length in *len. */
char *wirl_lowercase(wirl_str s, size_t *len);
/* The length of the whitespace character at s[i..], or 0 (Rust's char::is_whitespace). */
size_t wirl_whitespace_at(wirl_str s, size_t i);

#ifdef __cplusplus
}
#endif

#endif
