/* The exports and imports of wirl:rl@0.2.0's reward world (a plugin whose first line is
 * `// wirl-world: reward-plugin@0.2.0`): the group scored in one call with the run's
 * progress; the model asked through `inference` (generate, log-probs of given replies). */
#include <stdlib.h>
#include <string.h>

#include "wirl_glue.h"

static wirl_progress progress_now;

wirl_progress wirl_run_progress(void) { return progress_now; }

/* Defined by a plugin that scores its group at once; otherwise wirl_reward is called per
 * completion. */
__attribute__((weak)) void wirl_reward_group(const wirl_task *task, const wirl_str *completions, size_t n,
                                             wirl_result *results);
__attribute__((weak)) bool wirl_reward(const wirl_task *task, wirl_str completion, wirl_score *score, char **error);

void exports_wirl_rl_reward_score_group(exports_wirl_rl_reward_task_t *task, reward_plugin_list_string_t *completions,
                                        exports_wirl_rl_reward_progress_t *progress,
                                        exports_wirl_rl_reward_list_result_score_string_t *ret) {
    progress_now.step = progress->step;
    progress_now.steps = progress->steps;
    wirl_task t = wirl__task_of(task);
    size_t n = completions->len;
    ret->len = n;
    ret->ptr = n ? calloc(n, sizeof(*ret->ptr)) : NULL;
    if (wirl_reward_group) {
        wirl_str *texts = n ? calloc(n, sizeof(*texts)) : NULL;
        wirl_result *results = n ? calloc(n, sizeof(*results)) : NULL;
        for (size_t i = 0; i < n; i++) texts[i] = wirl__from_wit(&completions->ptr[i]);
        wirl_reward_group(&t, texts, n, results);
        for (size_t i = 0; i < n; i++) wirl__put_result(results[i].ok, &results[i].score, results[i].error, &ret->ptr[i]);
        free(results);
        free(texts);
    } else if (wirl_reward) {
        for (size_t i = 0; i < n; i++) wirl__score_one(&t, wirl__from_wit(&completions->ptr[i]), &ret->ptr[i]);
    } else {
        for (size_t i = 0; i < n; i++)
            wirl__put_result(false, &(wirl_score){0}, wirl_printf("this plugin defines neither wirl_reward nor wirl_reward_group"),
                             &ret->ptr[i]);
    }
    wirl__task_release(&t);
    exports_wirl_rl_reward_task_free(task);
    reward_plugin_list_string_free(completions);
}

/* A borrowed WIT string over a slice (the host only reads an import's arguments). */
static reward_plugin_string_t borrowed(wirl_str s) {
    reward_plugin_string_t out = {(uint8_t *)s.ptr, s.len};
    return out;
}

/* A conversation as a WIT list, its messages borrowed; free the list's array alone. */
static wirl_rl_inference_list_message_t messages_of(const wirl_conversation *conversation) {
    wirl_rl_inference_list_message_t list = {NULL, conversation->n_messages};
    list.ptr = list.len ? calloc(list.len, sizeof(*list.ptr)) : NULL;
    for (size_t i = 0; i < list.len; i++) {
        list.ptr[i].role = borrowed(conversation->messages[i].role);
        list.ptr[i].content = borrowed(conversation->messages[i].content);
    }
    return list;
}

/* The host's refusal as a malloc'd reason; frees the WIT string. */
static char *refusal(reward_plugin_string_t *err) {
    char *reason = wirl_printf("the model: %.*s", (int)err->len, (const char *)err->ptr);
    reward_plugin_string_free(err);
    return reason;
}

wirl_sampling wirl_sampling_greedy(uint32_t max_tokens) {
    wirl_sampling sampling;
    memset(&sampling, 0, sizeof sampling);
    sampling.max_tokens = max_tokens;
    sampling.top_p = 1.0f;
    return sampling;
}

bool wirl_generate(const wirl_conversation *conversations, size_t n, const wirl_sampling *sampling, wirl_reply *replies,
                   char **error) {
    wirl_rl_inference_list_list_message_t asked = {n ? calloc(n, sizeof(*asked.ptr)) : NULL, n};
    for (size_t i = 0; i < n; i++) asked.ptr[i] = messages_of(&conversations[i]);
    reward_plugin_string_t *stop = sampling->n_stop ? calloc(sampling->n_stop, sizeof(*stop)) : NULL;
    for (size_t i = 0; i < sampling->n_stop; i++) {
        wirl_str s = {sampling->stop[i], strlen(sampling->stop[i])};
        stop[i] = borrowed(s);
    }
    wirl_rl_inference_sampling_t how = {
        .max_tokens = sampling->max_tokens,
        .temperature = sampling->temperature,
        .top_p = sampling->top_p,
        .top_k = sampling->top_k,
        .min_p = sampling->min_p,
        .stop = {stop, sampling->n_stop},
        .seed = {sampling->has_seed, sampling->seed},
    };
    wirl_rl_inference_list_completion_t got;
    reward_plugin_string_t err;
    bool ok = wirl_rl_inference_generate(&asked, &how, &got, &err);
    for (size_t i = 0; i < n; i++) free(asked.ptr[i].ptr);
    free(asked.ptr);
    free(stop);
    if (!ok) {
        *error = refusal(&err);
        return false;
    }
    if (got.len != n) {
        *error = wirl_printf("the model gave %zu replies for %zu conversations", got.len, n);
        wirl_rl_inference_list_completion_free(&got);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        replies[i].len = got.ptr[i].text.len;
        replies[i].text = wirl_printf("%.*s", (int)got.ptr[i].text.len, (const char *)got.ptr[i].text.ptr);
        replies[i].cut = got.ptr[i].finish_reason == WIRL_RL_TYPES_FINISH_REASON_LENGTH;
    }
    wirl_rl_inference_list_completion_free(&got);
    return true;
}

void wirl_replies_free(wirl_reply *replies, size_t n) {
    for (size_t i = 0; i < n; i++) free(replies[i].text);
}

bool wirl_logprobs(const wirl_reply_to_score *asked, size_t n, wirl_scored_reply *scored, char **error) {
    wirl_rl_inference_list_reply_to_score_t list = {n ? calloc(n, sizeof(*list.ptr)) : NULL, n};
    for (size_t i = 0; i < n; i++) {
        list.ptr[i].conversation = messages_of(&asked[i].conversation);
        list.ptr[i].reply = borrowed(asked[i].reply);
    }
    wirl_rl_inference_list_reply_logprobs_t got;
    reward_plugin_string_t err;
    bool ok = wirl_rl_inference_logprobs(&list, &got, &err);
    for (size_t i = 0; i < n; i++) free(list.ptr[i].conversation.ptr);
    free(list.ptr);
    if (!ok) {
        *error = refusal(&err);
        return false;
    }
    bool shaped = got.len == n;
    for (size_t i = 0; shaped && i < n; i++) shaped = got.ptr[i].tokens.len == got.ptr[i].logprobs.len;
    if (!shaped) {
        *error = wirl_printf("the model's log-probs do not match the %zu replies asked", n);
        wirl_rl_inference_list_reply_logprobs_free(&got);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        size_t tokens = got.ptr[i].tokens.len;
        scored[i].n_tokens = tokens;
        scored[i].tokens = tokens ? calloc(tokens, sizeof(char *)) : NULL;
        scored[i].logprobs = tokens ? calloc(tokens, sizeof(float)) : NULL;
        scored[i].total = 0.0f;
        for (size_t k = 0; k < tokens; k++) {
            const reward_plugin_string_t *text = &got.ptr[i].tokens.ptr[k];
            scored[i].tokens[k] = wirl_printf("%.*s", (int)text->len, (const char *)text->ptr);
            scored[i].logprobs[k] = got.ptr[i].logprobs.ptr[k];
            scored[i].total += got.ptr[i].logprobs.ptr[k];
        }
    }
    wirl_rl_inference_list_reply_logprobs_free(&got);
    return true;
}

void wirl_scored_replies_free(wirl_scored_reply *scored, size_t n) {
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < scored[i].n_tokens; k++) free(scored[i].tokens[k]);
        free(scored[i].tokens);
        free(scored[i].logprobs);
    }
}
