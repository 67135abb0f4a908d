"""Statement text is spelled once per site and shape, and sites never share an entry."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ledger.statements import statement_spelled


def test_each_site_and_shape_is_spelled_once() -> None:
    calls: list[str] = []

    def spell(text: str) -> Callable[[], str]:
        def build() -> str:
            calls.append(text)
            return text
        return build

    assert statement_spelled(site="t-a", shape=("default", True), spell=spell("a1")) == "a1"
    assert statement_spelled(site="t-a", shape=("default", True), spell=spell("again")) == "a1"
    assert statement_spelled(site="t-a", shape=("default", False), spell=spell("a2")) == "a2"
    # The same shape at another site is that site's own statement.
    assert statement_spelled(site="t-b", shape=("default", True), spell=spell("b1")) == "b1"
    assert calls == ["a1", "a2", "b1"]


def test_threads_spelling_one_shape_at_once_all_get_the_same_text() -> None:
    start = threading.Barrier(8)
    seen: list[str] = []

    def spell() -> str:
        return "SELECT " + ", ".join(["1"] * 3)

    def run() -> None:
        start.wait()
        seen.append(statement_spelled(site="t-threads", shape="default", spell=spell))

    threads = [threading.Thread(target=run) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == ["SELECT 1, 1, 1"] * 8
