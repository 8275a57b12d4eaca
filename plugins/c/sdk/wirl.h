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
 *
 * wirl:rl@0.2.0 (first line `// wirl-world: reward-plugin@0.2.0`): the same `wirl_reward`,
 * or `wirl_reward_group` to score the group at once; `wirl_run_progress()` says where the run
 * stands; `wirl_generate` and `wirl_logprobs` ask the model (an LLM judge), within the
 * reward's `[[rewards]]` budget. See the end of this file.
 */
#ifndef WIRL_H
#define WIRL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
    wirl_str role;    /* system, user, assistant or tool */
    wirl_str content;
} wirl_message;

typedef struct {
    wirl_str id;
    bool has_answer;
    wirl_str answer;
    bool has_metadata;
    wirl_str metadata; /* JSON text */
    const wirl_message *messages; /* the conversation the model was shown */
    size_t n_messages;
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
/* The setting `key` as true or false: `fallback` when absent; false (and *error) otherwise. */
bool wirl_config_bool(const char *key, bool fallback, bool *out, char **error);

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

/* ---- wirl:rl@0.2.0 only ------------------------------------------------------------ */

/* Where the training run stands for the group being scored: the step (from 1) and the
 * steps planned; both 0 outside training (an evaluation, `wirl score`, a server). */
typedef struct {
    uint64_t step;
    uint64_t steps;
} wirl_progress;
wirl_progress wirl_run_progress(void);

/* One completion's verdict from `wirl_reward_group`: `ok` and `score`, or a malloc'd
 * `error` (the SDK frees the note and the error). */
typedef struct {
    bool ok;
    wirl_score score;
    char *error;
} wirl_result;

/* Optional: score the group at once (a judge asking about all of it in one call). When a
 * plugin defines it, the SDK calls it instead of `wirl_reward`; `results` has `n` zeroed
 * entries to fill. */
void wirl_reward_group(const wirl_task *task, const wirl_str *completions, size_t n, wirl_result *results);

typedef struct {
    const wirl_message *messages;
    size_t n_messages;
} wirl_conversation;

typedef struct {
    uint32_t max_tokens;
    float temperature; /* 0: greedy */
    float top_p;       /* 1: all */
    uint32_t top_k;    /* 0: all */
    float min_p;       /* 0: all */
    const char *const *stop; /* NUL-terminated stop strings */
    size_t n_stop;
    bool has_seed;
    uint64_t seed;
} wirl_sampling;
/* Greedy sampling of at most `max_tokens` tokens, no stop strings. */
wirl_sampling wirl_sampling_greedy(uint32_t max_tokens);

/* A reply: malloc'd, NUL-terminated text of `len` bytes; `cut` when it stopped at max_tokens. */
typedef struct {
    char *text;
    size_t len;
    bool cut;
} wirl_reply;

/* One reply per conversation into `replies[0..n]`; false with a malloc'd `*error` (the
 * host's reason: the budget spent, no model here) when refused. */
bool wirl_generate(const wirl_conversation *conversations, size_t n, const wirl_sampling *sampling, wirl_reply *replies,
                   char **error);
void wirl_replies_free(wirl_reply *replies, size_t n);

/* A reply to score as the assistant's next turn after `conversation`. */
typedef struct {
    wirl_conversation conversation;
    wirl_str reply;
} wirl_reply_to_score;

/* How likely the model finds a reply: its tokens' texts (malloc'd; they join into the
 * reply), each token's natural-log probability, and their sum. */
typedef struct {
    size_t n_tokens;
    char **tokens;
    float *logprobs;
    float total;
} wirl_scored_reply;

/* The log-probs of each of `asked[0..n]` into `scored[0..n]`, nothing sampled; false with a
 * malloc'd `*error` when refused (the budget, the context, no model, a host that only
 * samples). */
bool wirl_logprobs(const wirl_reply_to_score *asked, size_t n, wirl_scored_reply *scored, char **error);
void wirl_scored_replies_free(wirl_scored_reply *scored, size_t n);

#ifdef __cplusplus
}
#endif

#endif
