"""A bundle's calls as :class:`datavine.manager.bundle_calls.BundleCalls` keeps them, against a
fake of TaskVine's C functions: each call's state and worker read in one go, as a pool
sample reads them, agree with the reads one by one; a call TaskVine returned reads empty.
(Real calls: tests/test_payload_codec.py, tests/test_library_queue.py.)"""

from __future__ import annotations

import itertools

from datavine.manager.bundle_calls import BundleCalls, Flags


class FakeC:
    """The C functions BundleCalls calls, on plain objects."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.tasks: dict[int, dict[str, object]] = {}

    def vine_task_create(self, command: str) -> dict[str, object]:
        return {"state": "INITIAL", "addr": None}

    def vine_declare_buffer(self, manager: object, data: bytes, cache: int,
                            flags: int) -> object:
        return object()

    def vine_task_set_library_required(self, task: object, name: str) -> None: ...
    def vine_task_set_cores(self, task: object, cores: int) -> None: ...
    def vine_task_add_feature(self, task: object, name: str) -> int: return 1
    def vine_task_add_input(self, *args: object) -> int: return 1
    def vine_task_add_output(self, *args: object) -> int: return 1
    def vine_undeclare_file(self, manager: object, file: object) -> None: ...
    def vine_task_delete(self, task: object) -> None: ...

    def vine_submit(self, manager: object, task: dict[str, object]) -> int:
        task_id = next(self.ids)
        task.update(id=task_id, state="READY")
        self.tasks[task_id] = task
        return task_id

    def vine_task_get_state(self, task: dict[str, object]) -> str:
        return str(task["state"])

    def vine_task_get_addrport(self, task: dict[str, object]) -> object:
        return task["addr"]


def test_states_and_workers_read_in_one_go_agree_with_one_by_one() -> None:
    c = FakeC()
    calls = BundleCalls(c, object(), Flags(0, 0, 0), "run_bundle",  # type: ignore[arg-type]
                        lambda task: None)
    waiting, running, queued = (calls.submit("lib", b"x") for _ in range(3))
    c.tasks[running].update(state="RUNNING", addr="1.2.3.4:5")
    c.tasks[queued].update(state="RUNNING", addr="1.2.3.4:6")  # in a library's queue
    places = calls.places([waiting, running, queued, 99])
    assert places == {waiting: ("READY", None), running: ("RUNNING", "1.2.3.4:5"),
                      queued: ("RUNNING", "1.2.3.4:6"), 99: ("", None)}
    for task_id, (state, _) in places.items():
        assert calls.state(task_id) == state
    assert places[running][1] == calls.worker(running)
