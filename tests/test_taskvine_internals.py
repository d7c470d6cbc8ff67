"""One test per assumption datavine makes on TaskVine's private internals
(:data:`datavine.manager.taskvine_internals.ASSUMPTIONS`): a TaskVine upgrade that breaks one
fails the test named after it, not a run. They run on whatever TaskVine this session
imports (the project's build; in scripts/test.sh's stock lane, TaskVine as released)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from datavine.manager.taskvine_internals import ASSUMPTIONS, Internals, broken

pytestmark = pytest.mark.taskvine


@pytest.fixture(scope="module")
def internals() -> Internals:
    import ndcctools.poncho.library_network_code as library_code
    import ndcctools.taskvine as vine

    return Internals(vine, library_code)


@pytest.fixture(scope="module")
def worker() -> Path:
    from datavine.deploy.binaries import vine_binary

    return vine_binary("vine_worker")


@pytest.mark.parametrize("name", list(ASSUMPTIONS))
def test_assumption_holds(name: str, internals: Internals, worker: Path) -> None:
    assert ASSUMPTIONS[name](internals, worker) is None


def test_a_live_manager_has_what_the_adapter_reads(internals: Internals, tmp_path: Path) -> None:
    """The same assumptions, read on a running manager: its C pointer, its task table, a
    buffer's pointer, the library-file hook, and its deterministic end."""
    vine = internals.vine
    manager = vine.Manager(port=0, run_info_path=str(tmp_path))
    try:
        assert internals.manager_pointer(manager) is not None
        assert internals.take_task(manager, 12345) is None  # a dict, keyed by task id
        buffer = manager.declare_buffer(b"x", cache=False, peer_transfer=False)
        assert internals.file_pointer(buffer) is not None
        with internals.unshared_library_files(manager):
            assert "declare_file" in vars(manager)
        assert "declare_file" not in vars(manager)
        manager.undeclare_file(buffer)
    finally:
        internals.free_manager(manager)
    assert getattr(manager, "_taskvine", None) is None


def test_a_broken_assumption_is_named_alone(internals: Internals, worker: Path) -> None:
    """Bindings whose FunctionCall lost a field fail that assumption and no other."""
    class Call:
        def __init__(self) -> None:
            self._event = None

        def submit_finalize(self) -> None:
            self.get_library_required()  # no _input_file / _output_file any more

        @property
        def output(self) -> object:
            return None

    fake = types.SimpleNamespace(**{n: getattr(internals.vine, n) for n in dir(internals.vine)
                                    if not n.startswith("__")})
    fake.FunctionCall = Call
    changed = Internals.__new__(Internals)
    changed.vine, changed.library_code, changed.c = fake, internals.library_code, internals.c
    found = broken(changed, worker)
    assert list(found) == ["function-call-fields"]
    assert "self._input_file" in found["function-call-fields"]
