// wirl-world: reward-plugin
/* `{name}`: reward 1 when the completion holds the task's answer, else 0.
 *
 * Build: `{build}`; try it:
 * `{try}` */
#include "wirl.h"

bool wirl_reward(const wirl_task *task, wirl_str completion, wirl_score *score, char **error) {
    if (!task->has_answer) {
        *error = wirl_printf("task %.*s has no answer", WIRL_FMT(task->id));
        return false;
    }
    wirl_str answer = wirl_str_trim(task->answer);
    float correct = wirl_str_contains(completion, answer) ? 1.0f : 0.0f;
    score->reward = correct;
    wirl_part_add(score, "correct", correct);
    score->note = wirl_printf("looked for \"%.*s\"", WIRL_FMT(answer));
    return true;
}
