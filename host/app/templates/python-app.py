# wirl-world: reward-plugin
"""`{name}`: reward 1 when the completion holds the task's answer, else 0.

Build: `{build}`; try it:
`{try}`
"""

from wirl import Reward, Score, Task, Unscorable, config, reward  # noqa: F401 (Reward is the export)


@reward
def score(task: Task, completion: str) -> Score:
    if task.answer is None:
        raise Unscorable(f"task {task.id} has no answer")
    answer = task.answer.strip()
    if config("ignore_case", False):
        found = answer.lower() in completion.lower()
    else:
        found = answer in completion
    correct = 1.0 if found else 0.0
    return Score.of(correct, note=f"looked for {answer!r}", correct=correct)
