# Type stubs of the extension module (python/src), held to it by python/tests/test_stubs.py
# (names, parameters, defaults, properties, both ways). The package's own modules are typed inline.
from typing import Optional, Sequence

WIT_PACKAGE: str
WIT_VERSION: str
WIT_VERSIONS: list[str]
VERSION: str

class PluginError(Exception): ...

def builtins() -> list[tuple[str, str, str]]: ...
def set_worker_command(program: str, args: Sequence[str]) -> None: ...
def interrupt_all() -> None: ...
def serve_code_worker() -> None: ...

# (reward or None, verdict, message, parts, note, micros)
_Scored = tuple[Optional[float], str, str, list[tuple[str, float]], Optional[str], int]
# (termination, exit status, crash message, stdout, stderr, truncated, milliseconds)
_Ran = tuple[str, Optional[int], Optional[str], str, str, bool, int]

class NativeReward:
    name: str
    sha256: str
    code_runner_sha256: Optional[str]
    world: str
    threads: int
    def __init__(
        self,
        plugin: str,
        config_json: Optional[str] = None,
        deadline_ms: Optional[int] = None,
        memory_mib: Optional[int] = None,
        fuel: Optional[int] = None,
        reuse_instance: bool = False,
        code_runner: Optional[str] = None,
        code_workers: int = 0,
        code_deadline_ms: Optional[int] = None,
        code_memory_mib: Optional[int] = None,
        threads: Optional[int] = None,
        inference_url: Optional[str] = None,
        inference_model: Optional[str] = None,
        inference_api_key: Optional[str] = None,
        inference_calls: int = 8,
        inference_tokens: int = 8192,
        inference_timeout_ms: int = 120000,
    ) -> None: ...
    def score(self, batch_json: str, step: int = 0, steps: int = 0) -> list[_Scored]: ...

class NativeCodeRunner:
    sha256: str
    workers: int
    def __init__(
        self,
        runner: str,
        deadline_ms: Optional[int] = None,
        memory_mib: Optional[int] = None,
        fuel: Optional[int] = None,
        max_output_bytes: Optional[int] = None,
        workers: int = 0,
        threads: Optional[int] = None,
    ) -> None: ...
    def worker_pids(self) -> list[int]: ...
    def run(
        self,
        programs: Sequence[tuple[str, str, str, Sequence[str]]],
        wall_ms: int = 0,
        memory_bytes: int = 0,
        fuel: Optional[int] = None,
        max_output_bytes: int = 0,
    ) -> list[_Ran]: ...

class NativeEpisode:
    def step(self, reply: str) -> tuple[Optional[str], str, str]: ...

class NativeEnvironment:
    sha256: str
    def __init__(
        self,
        plugin: str,
        config_json: Optional[str] = None,
        deadline_ms: Optional[int] = None,
        memory_mib: Optional[int] = None,
        fuel: Optional[int] = None,
    ) -> None: ...
    def describe(self) -> tuple[str, Optional[int], bool]: ...
    def task_at(self, seed: int, index: int) -> tuple[Optional[str], str, str]: ...
    def start(self, task_json: str) -> tuple[Optional[NativeEpisode], str, str]: ...
