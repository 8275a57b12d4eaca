/* The C helper's internals shared by wirl.c and the exports of each version (wirl_v0_1.c,
 * wirl_v0_2.c). Not for plugins: include "wirl.h". */
#ifndef WIRL_GLUE_H
#define WIRL_GLUE_H

#include "reward_plugin.h"
#include "wirl.h"

/* A WIT string as a slice (borrowed). */
wirl_str wirl__from_wit(const reward_plugin_string_t *s);
/* A malloc'd copy of `text` ("" for NULL) as a WIT string. */
void wirl__copy_string(reward_plugin_string_t *to, const char *text);
/* The task as the helper's struct: slices of `t`, and a malloc'd messages array that
 * wirl__task_release frees. */
wirl_task wirl__task_of(const wirl_rl_types_task_t *t);
void wirl__task_release(wirl_task *task);
/* A WIT result from a verdict: the score when `ok`, else `error` (or a stock reason); frees
 * the score's note and `error`. */
void wirl__put_result(bool ok, wirl_score *score, char *error, exports_wirl_rl_reward_result_score_string_t *out);
/* `wirl_reward` on one completion, as a WIT result; whether it scored. */
bool wirl__score_one(const wirl_task *task, wirl_str completion, exports_wirl_rl_reward_result_score_string_t *out);

#endif
