// wirl-world: reward-plugin@0.2.0
/* A `wirl:rl@0.2.0` judge in C for tests, as plugins/tests/word-judge in Rust: it asks the
 * model about every completion of a group in one `wirl_generate` call (greedy, `max_tokens`
 * from its config, default 6) and rewards each with the number of words of the model's
 * reply, kept as its note; it also reports the step it is scored at (part `step`). A refused
 * call (no model, a spent budget) fails every completion with the host's reason. With
 * `likelihood = true` it asks instead how likely the model finds each completion as the reply to
 * the task (`wirl_logprobs`), as plugins/tests/likelihood: the mean log-prob per token, parts
 * `total` and `tokens`, the tokens' texts joined as its note. */
#include <stdlib.h>
#include <string.h>

#include "wirl.h"

static void fail_all(size_t n, wirl_result *results, const char *error) {
    for (size_t i = 0; i < n; i++) {
        results[i].ok = false;
        results[i].error = wirl_printf("%s", error);
    }
}

static void by_likelihood(const wirl_task *task, const wirl_str *completions, size_t n, wirl_result *results) {
    wirl_reply_to_score *asked = calloc(n ? n : 1, sizeof(*asked));
    wirl_scored_reply *scored = calloc(n ? n : 1, sizeof(*scored));
    wirl_conversation conversation = {task->messages, task->n_messages};
    for (size_t i = 0; i < n; i++) {
        asked[i].conversation = conversation;
        asked[i].reply = completions[i];
    }
    char *error = NULL;
    if (!wirl_logprobs(asked, n, scored, &error)) {
        fail_all(n, results, error);
        free(error);
    } else {
        for (size_t i = 0; i < n; i++) {
            size_t tokens = scored[i].n_tokens;
            float mean = tokens ? scored[i].total / (float)tokens : 0.0f;
            size_t bytes = 1;
            for (size_t k = 0; k < tokens; k++) bytes += strlen(scored[i].tokens[k]);
            char *note = calloc(bytes, 1);
            for (size_t k = 0; k < tokens; k++) strcat(note, scored[i].tokens[k]);
            results[i].ok = true;
            results[i].score.reward = mean;
            wirl_part_add(&results[i].score, "total", scored[i].total);
            wirl_part_add(&results[i].score, "tokens", (float)tokens);
            results[i].score.note = note;
        }
        wirl_scored_replies_free(scored, n);
    }
    free(scored);
    free(asked);
}

static size_t words(const char *text, size_t len) {
    wirl_str s = {text, len};
    size_t count = 0, i = 0;
    bool in_word = false;
    while (i < len) {
        size_t space = wirl_whitespace_at(s, i);
        if (space) {
            in_word = false;
            i += space;
        } else {
            if (!in_word) count++;
            in_word = true;
            i++;
        }
    }
    return count;
}

void wirl_reward_group(const wirl_task *task, const wirl_str *completions, size_t n, wirl_result *results) {
    double max_tokens = 6;
    bool likelihood = false;
    char *error = NULL;
    if (!wirl_config_bool("likelihood", false, &likelihood, &error) ||
        !wirl_config_number("max_tokens", 6, &max_tokens, &error)) {
        fail_all(n, results, error);
        free(error);
        return;
    }
    if (likelihood) {
        by_likelihood(task, completions, n, results);
        return;
    }
    /* The task's messages joined by spaces, then the completion: the user's one message. */
    size_t asked_len = 0;
    for (size_t m = 0; m < task->n_messages; m++) asked_len += task->messages[m].content.len + 1;
    char *asked = calloc(asked_len + 1, 1);
    for (size_t m = 0; m < task->n_messages; m++) {
        if (m) strcat(asked, " ");
        strncat(asked, task->messages[m].content.ptr, task->messages[m].content.len);
    }
    wirl_message *messages = calloc(n ? n : 1, sizeof(*messages));
    wirl_conversation *conversations = calloc(n ? n : 1, sizeof(*conversations));
    char **prompts = calloc(n ? n : 1, sizeof(char *));
    for (size_t i = 0; i < n; i++) {
        prompts[i] = wirl_printf("%s %.*s", asked, WIRL_FMT(completions[i]));
        messages[i].role = (wirl_str){"user", 4};
        messages[i].content = (wirl_str){prompts[i], strlen(prompts[i])};
        conversations[i].messages = &messages[i];
        conversations[i].n_messages = 1;
    }
    wirl_sampling sampling = wirl_sampling_greedy((uint32_t)max_tokens);
    wirl_reply *replies = calloc(n ? n : 1, sizeof(*replies));
    if (!wirl_generate(conversations, n, &sampling, replies, &error)) {
        fail_all(n, results, error);
        free(error);
    } else {
        wirl_progress progress = wirl_run_progress();
        for (size_t i = 0; i < n; i++) {
            float counted = (float)words(replies[i].text, replies[i].len);
            results[i].ok = true;
            results[i].score.reward = counted;
            wirl_part_add(&results[i].score, "judge_words", counted);
            wirl_part_add(&results[i].score, "step", (float)progress.step);
            results[i].score.note = wirl_printf("%s", replies[i].text);
        }
        wirl_replies_free(replies, n);
    }
    for (size_t i = 0; i < n; i++) free(prompts[i]);
    free(replies);
    free(prompts);
    free(conversations);
    free(messages);
    free(asked);
}
