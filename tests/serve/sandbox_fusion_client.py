"""SandboxFusion's own PyPI client (`sandbox-fusion`) and verl's exact request against
`wirl sandbox serve`: prints what each call came back with, as JSON, for the Rust test to
check. Usage: sandbox_fusion_client.py http://HOST:PORT"""

import base64
import json
import sys

import requests
from sandbox_fusion import RunCodeRequest, RunStatus, run_code, set_endpoint

url = sys.argv[1]
set_endpoint(url)
seen = {}


def run(**fields):
    result = run_code(RunCodeRequest(**fields), max_attempts=1)
    return {
        "status": result.status.value if isinstance(result.status, RunStatus) else result.status,
        "run_status": result.run_result.status.value if result.run_result else None,
        "return_code": result.run_result.return_code if result.run_result else None,
        "stdout": result.run_result.stdout if result.run_result else None,
        "stderr": result.run_result.stderr if result.run_result else None,
        "files": result.files,
    }


seen["hello"] = run(code="print('hello, world')", language="python")
seen["hello_nodejs"] = run(code="console.log('hello, world')", language="nodejs")
seen["stdin_nodejs"] = run(
    code="const n = require('fs').readFileSync(0, 'utf8').split(/\\s+/).filter(Boolean).map(Number)\nconsole.log(n.reduce((a, b) => a + b))",
    language="nodejs",
    stdin="1 2 3\n",
)
seen["hello_lua"] = run(code="print('hello, world')", language="lua")
seen["stdin_lua"] = run(code="local s = 0\nfor n in io.read('a'):gmatch('%d+') do s = s + tonumber(n) end\nprint(s)", language="lua", stdin="1 2 3\n")
seen["exit_code_lua"] = run(code="pcall(os.exit, 3)", language="lua")
seen["raised_lua"] = run(code="error('no')", language="lua")
seen["files_lua"] = run(
    code="local n = 0\nfor _ in io.lines('data/table.csv') do n = n + 1 end\nlocal out = assert(io.open('out.txt', 'w'))\nout:write(n)\nout:close()",
    language="lua",
    files={"data/table.csv": base64.b64encode(b"a,b\n1,2\n").decode()},
    fetch_files=["out.txt"],
)
seen["files_lua"]["fetched"] = base64.b64decode(seen["files_lua"]["files"].get("out.txt", "")).decode()
seen["hello_ruby"] = run(code="puts 'hello, world'", language="ruby")
seen["stdin_ruby"] = run(code="puts $stdin.read.split.map(&:to_i).sum", language="ruby", stdin="1 2 3\n")
seen["exit_code_ruby"] = run(code="begin\n  exit 3\nensure\n  $stdout.puts 'ensure ran'\nend", language="ruby")
seen["raised_ruby"] = run(code="raise ArgumentError, 'no'", language="ruby")
seen["files_ruby"] = run(
    code="n = File.readlines('data/table.csv').size\nFile.write('out.txt', n.to_s)",
    language="ruby",
    files={"data/table.csv": base64.b64encode(b"a,b\n1,2\n").decode()},
    fetch_files=["out.txt"],
)
seen["files_ruby"]["fetched"] = base64.b64decode(seen["files_ruby"]["files"].get("out.txt", "")).decode()
seen["stdin"] = run(code="import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))", language="python", stdin="1 2 3\n")
seen["exit_code"] = run(code="import sys\nsys.exit(3)", language="python")
seen["raised"] = run(code="raise ValueError('no')", language="python")
seen["timeout"] = run(code="while True:\n    pass", language="python", run_timeout=1)
table = base64.b64encode(b"a,b\n1,2\n").decode()
seen["files"] = run(
    code="rows = open('data/table.csv').read().split()\nopen('out.txt', 'w').write(str(len(rows)))",
    language="python",
    files={"data/table.csv": table},
    fetch_files=["out.txt"],
)
seen["files"]["fetched"] = base64.b64decode(seen["files"]["files"].get("out.txt", "")).decode()

# A language wirl does not run, and a malformed request: the client raises on non-200.
for name, body in [
    ("unknown_language", {"code": "x", "language": "cobol"}),
    ("no_code", {"language": "python"}),
    ("bad_timeout", {"code": "x", "language": "python", "run_timeout": "ten"}),
    ("escaping_file", {"code": "x", "language": "python", "files": {"../x": ""}}),
]:
    response = requests.post(f"{url}/run_code", json=body, timeout=30)
    seen[name] = {"status": response.status_code, "param": response.json()["error"]["param"]}

# verl's `call_sandbox_api` (verl/utils/reward_score/sandbox_fusion/utils.py): its payload,
# headers, and how it reads the answer.
payload = json.dumps(
    {
        "compile_timeout": 10,
        "run_timeout": 10,
        "code": "a, b = map(int, input().split())\nprint(a + b)",
        "stdin": "2 40\n",
        "memory_limit_MB": 1024,
        "language": "python",
        "files": {},
        "fetch_files": [],
    }
)
headers = {"Content-Type": "application/json", "Accept": "application/json"}
response = requests.post(f"{url}/run_code", headers=headers, data=payload, timeout=30)
response.raise_for_status()
answer = response.json()
seen["verl"] = {
    "status": answer["status"],
    "run_status": answer["run_result"]["status"],
    "stdout": answer["run_result"]["stdout"],
    "passed": answer["status"] == "Success" and answer["run_result"]["stdout"].rstrip("\n") == "42",
}
print(json.dumps(seen))
