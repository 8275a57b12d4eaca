# wirl-world: code-runner-plugin
"""The code runner for the humaneval-grader: the same runner (its module, copied at build
into plugins/target/python-gen/humaneval-runner by scripts/build-plugins) with the grader's
judge, codec and candidate driver imported here, so they are compiled once, into the
snapshot, instead of in every program.

The grader asks for `wirl_humaneval_judge` and sends the whole source to a runner that lacks
it. A candidate program can import the module too; that changes nothing the grader believes
(only the values its function returns, judged in another instance).
"""

import wirl_humaneval_judge  # noqa: F401  compiled into the snapshot
from wirl_code_runner import CodeRunner  # noqa: F401  the exported interface
