"""Input awareness finds the files a task will open from its arguments."""

from __future__ import annotations

from dataclasses import dataclass

from dask._task_spec import DataNode, Task

from datavine.scheduler.inputs import looks_like_input, task_files


@dataclass
class WorkItem:
    dataset: str
    filename: str
    entrystart: int
    entrystop: int


def process(*args, **kwargs):
    return None


def test_strings_that_name_inputs() -> None:
    assert looks_like_input("/data/nano_dy.root")
    assert looks_like_input("root://xcache:1094//store/a.root")
    assert looks_like_input("https://host/file")
    assert looks_like_input("/data/f.root:Events")
    assert not looks_like_input("sum-aggregate")
    assert not looks_like_input("Events")


def test_task_arguments_are_scanned() -> None:
    t = Task("k", process, "/d/a.root", 0, 100, opts={"other": "root://s//d/b.root"})
    assert task_files(t) == ("/d/a.root", "root://s//d/b.root")


def test_objects_with_filename() -> None:
    item = WorkItem("dy", "/d/c.root", 0, 10)
    assert task_files(Task("k", process, item)) == ("/d/c.root",)
    assert task_files(DataNode("k", item)) == ("/d/c.root",)


def test_plain_tasks_have_no_inputs() -> None:
    assert task_files(Task("k", process, 1, 2, [3, "x"])) == ()
