/* The exports of wirl:rl@0.1.0's reward world: one completion, or a group one at a time. */
#include <stdlib.h>
#include <string.h>

#include "wirl_glue.h"

/* A strong reference: a 0.1.0 plugin must define wirl_reward (the link says so if not). */
bool (*const wirl__reward_required)(const wirl_task *, wirl_str, wirl_score *, char **) = wirl_reward;

bool exports_wirl_rl_reward_score_completion(exports_wirl_rl_reward_task_t *task, reward_plugin_string_t *completion,
                                             exports_wirl_rl_reward_score_t *ret, reward_plugin_string_t *err) {
    wirl_task t = wirl__task_of(task);
    exports_wirl_rl_reward_result_score_string_t result;
    memset(&result, 0, sizeof result);
    bool scored = wirl__score_one(&t, wirl__from_wit(completion), &result);
    if (scored) {
        *ret = result.val.ok;
    } else {
        *err = result.val.err;
    }
    wirl__task_release(&t);
    exports_wirl_rl_reward_task_free(task);
    reward_plugin_string_free(completion);
    return scored;
}

void exports_wirl_rl_reward_score_group(exports_wirl_rl_reward_task_t *task, reward_plugin_list_string_t *completions,
                                        exports_wirl_rl_reward_list_result_score_string_t *ret) {
    wirl_task t = wirl__task_of(task);
    ret->len = completions->len;
    ret->ptr = completions->len ? calloc(completions->len, sizeof(*ret->ptr)) : NULL;
    for (size_t i = 0; i < completions->len; i++) wirl__score_one(&t, wirl__from_wit(&completions->ptr[i]), &ret->ptr[i]);
    wirl__task_release(&t);
    exports_wirl_rl_reward_task_free(task);
    reward_plugin_list_string_free(completions);
}
