"""The import table (issue 25): real command lines from the engines' READMEs, docs and issues
(tests/data/real_commands.yaml, each with its source) read by ``hrm import`` to the policy the
flags say — derived by hand in each entry's note — or refused in one line naming why."""

from __future__ import annotations

from pathlib import Path

import pytest

from hrm.export.real_commands import load_real_commands, read_real_command

TABLE = Path(__file__).parent / "data" / "real_commands.yaml"
ENTRIES = load_real_commands(TABLE)


def test_the_table_is_big_enough_and_cited():
    assert len(ENTRIES) >= 15
    assert len({e.engine for e in ENTRIES}) >= 4
    assert all(e.source.strip() for e in ENTRIES)
    assert sum(e.expect.refused is None for e in ENTRIES) >= 8  # most read to a policy


@pytest.mark.parametrize("entry", ENTRIES, ids=[f"{e.engine}-{i}" for i, e in enumerate(ENTRIES)])
def test_real_command(entry):
    policy, notes, refusal = read_real_command(entry)
    want = entry.expect
    if want.refused is not None:
        assert refusal is not None and want.refused in refusal and "\n" not in refusal, (entry.source, refusal)
        return
    assert refusal is None, (entry.source, refusal)
    if want.policy is not None:
        assert policy.short() == want.policy, entry.source
    for field in ("batch_size", "micro_batch_size", "attn_on_gpu"):
        if getattr(want, field) is not None:
            assert getattr(policy, field) == getattr(want, field), (entry.source, field)
    if want.weights_gpu_ratio is not None:
        assert policy.weights_gpu_ratio == pytest.approx(want.weights_gpu_ratio, abs=1e-9), entry.source


def test_ollama_rows_read_to_a_policy_and_the_page_says_the_counts():
    from hrm.export.real_commands import policy_counts

    counts = policy_counts(ENTRIES)
    assert counts["ollama"][0] >= 2 and counts["llama.cpp"][0] >= 8
    page = (Path(__file__).parent.parent / "docs" / "engines" / "imports.md").read_text()
    assert f"llama.cpp {counts['llama.cpp'][0]} of {counts['llama.cpp'][1]}" in page
    assert f"ollama {counts['ollama'][0]} of {counts['ollama'][1]}" in page


def test_cpu_expert_engines_read_at_least_15_and_the_page_says_so():
    """Issue 34: at least 15 llama.cpp, ollama and kTransformers commands read to a policy."""
    from hrm.export.real_commands import cpu_expert_read_count

    read = cpu_expert_read_count(ENTRIES)
    assert read >= 15
    by_hand = sum(e.expect.refused is None for e in ENTRIES if e.engine in ("llama.cpp", "ollama")) + sum(
        e.expect.refused is None for e in ENTRIES if e.engine == "sglang" and "--kt-weight-path" in e.command)
    assert read == by_hand
    page = (Path(__file__).parent.parent / "docs" / "engines" / "imports.md").read_text()
    assert f"(llama.cpp + ollama + ktransformers (sglang --kt)): {read}." in page


def test_ktransformers_rows_read_and_the_page_counts_them():
    """Issue 34 part 3: kTransformers commands (SGLang's --kt-*) read to a policy, at least 3,
    and the page's per-engine line says how many of how many."""
    from hrm.export.real_commands import cpu_expert_counts

    kt = [e for e in ENTRIES if e.engine == "sglang" and "--kt-weight-path" in e.command]
    read = sum(e.expect.refused is None for e in kt)
    assert read >= 3 and cpu_expert_counts(ENTRIES)["ktransformers (sglang --kt)"] == (read, len(kt))
    page = (Path(__file__).parent.parent / "docs" / "engines" / "imports.md").read_text()
    assert f"ktransformers (sglang --kt) {read} of {len(kt)}." in page
