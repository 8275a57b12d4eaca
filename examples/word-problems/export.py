"""Export GSM-style word problems from reasoning-gym (Apache-2.0; its licence is kept in
LICENSE.reasoning-gym beside this file) as the Parquet files of this directory.

    python3 -m venv venv && venv/bin/pip install reasoning-gym==0.1.25 pyarrow
    venv/bin/python export.py

`gsm_symbolic` fills GSM8K templates with new numbers: the questions read like GSM8K and
every answer is an integer. train.parquet: 2,000 problems (seed 1) in row groups of 500;
eval.parquet: 200 problems (seed 2). Columns: id, question, answer, template (the GSM8K
template's index, kept as metadata).
"""

import pyarrow as pa
import pyarrow.parquet as pq
import reasoning_gym

SUFFIX = " Give the result as your final answer. Do not include units."


def table(size: int, seed: int, split: str) -> pa.Table:
    rows = list(reasoning_gym.create_dataset("gsm_symbolic", size=size, seed=seed))
    return pa.table(
        {
            "id": [f"word-problems/{split}/{i}" for i in range(len(rows))],
            "question": [r["question"].removesuffix(SUFFIX) for r in rows],
            "answer": [str(r["answer"]) for r in rows],
            "template": [int(r["metadata"]["source_index"]) for r in rows],
        }
    )


pq.write_table(table(2000, 1, "train"), "train.parquet", row_group_size=500, compression="snappy")
pq.write_table(table(200, 2, "eval"), "eval.parquet", row_group_size=200, compression="snappy")
