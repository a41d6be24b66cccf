"""Local attention (docs/model.md §3.2): sliding windows and Llama 4's chunks. What a decode step
reads, what a prefill's causal pairs are and what KV a sequence keeps, against hand numbers and
against a count of llama.cpp's mask rule (is_masked_swa, ggml-org/llama.cpp@0c1e5709
src/llama-hparams.h:482-495: a standard window masks p1 − p0 ≥ w, a chunk masks p0 below the
query's chunk start ⌊p1 / C⌋·C)."""

import numpy as np
import pytest
from pydantic import ValidationError

from hrm.cost import costs
from hrm.cost.memory import kv_cache_bytes, memory_limits
from hrm.engines.engine import resolve_engine
from hrm.machine.hardware import load_hardware
from hrm.model.options import DEFAULT_OPTIONS
from hrm.model.spec import CATALOG_DIR, ModelSpec, load_model
from hrm.problem import make_problem
from hrm.workload import make_workload
from solver.lanes.terms import build_terms, enumerate_modes, total_time_s

C = 8192  # Llama 4's attention_chunk_size


def _local(model: ModelSpec, kind: str, window: int, layers: int) -> ModelSpec:
    return ModelSpec.model_validate({**model.model_dump(), "sliding_window": window, "sliding_window_layers": layers,
                                     "local_attention": kind})


def _keys_seen(kind: str, window: int, query_pos: int) -> int:
    """Keys 0 … query_pos that llama.cpp's mask leaves to the query at ``query_pos``."""
    keys = np.arange(query_pos + 1)
    if kind == "sliding":
        return int(np.sum(query_pos - keys < window))
    return int(np.sum(keys >= (query_pos // window) * window))


@pytest.fixture
def scout():
    return load_model("llama-4-scout")


def test_scout_is_chunked(scout):
    assert (scout.local_attention, scout.sliding_window, scout.sliding_window_layers, scout.num_layers) == (
        "chunked", C, 36, 48)


@pytest.mark.parametrize("context,chunk_tokens", [(1, 1), (C, C), (C + 1, 1), (2 * C + 5, 5), (0, 0)])
def test_chunk_reads_by_hand(context, chunk_tokens):
    assert float(costs.chunk_position_tokens(context, C)) == chunk_tokens


@pytest.mark.parametrize("context,read", [
    (1, 1.0), (C, C),
    (C + 1, (12 * (C + 1) + 36 * 1) / 48),  # 2049: the 36 chunked layers start a new chunk
    (2 * C + 5, (12 * (2 * C + 5) + 36 * 5) / 48),  # 4101
])
def test_scout_decode_reads_by_hand(scout, context, read):
    assert float(costs.attended_context(scout, context)) == read


@pytest.mark.parametrize("kind", ["sliding", "chunked"])
def test_decode_reads_count_the_mask(tiny, kind):
    """Every context 0 … 13 of a 2-layer model with one local layer of 4: the mean of the full
    layer's c and the local layer's keys at query position c − 1, by the mask rule."""
    model = _local(tiny, kind, 4, 1)
    for c in range(14):
        local = _keys_seen(kind, 4, c - 1) if c else 0
        assert float(costs.attended_context(model, c)) == (c + local) / 2, c


@pytest.mark.parametrize("kind", ["sliding", "chunked"])
def test_prefill_pairs_are_the_integral_of_the_reads(tiny, kind):
    """Prefill pairs are ∫₀ˢ keys(x) dx, the full layer's s²/2 convention: a midpoint sum on a
    grid of halves (exact on each linear piece, the chunk edges on the grid) of x, min(x, 4) or
    x mod 4."""
    model = _local(tiny, kind, 4, 1)
    for s in range(0, 15):
        x = np.arange(0.25, s, 0.5)
        local = np.minimum(x, 4) if kind == "sliding" else x % 4
        assert float(costs.attended_pairs(model, s)) == pytest.approx((np.sum(x) + np.sum(local)) * 0.5 / 2), s


def test_scout_prefill_pairs_by_hand(scout):
    # s = 2C + 5: full s²/2 = 134299660.5; chunked 2·C²/2 + 5²/2 = 67108876.5
    assert float(costs.attended_pairs(scout, 2 * C + 5)) == (12 * 134299660.5 + 36 * 67108876.5) / 48
    assert float(costs.attended_pairs(scout, C)) == C * C / 2  # one whole chunk: every layer alike
    assert float(costs.attended_pairs(scout, 100)) == 5000


def test_chunked_kv_kept_is_the_worst_position(scout):
    """A chunked layer keeps a whole chunk at each chunk's last position: at 8193 tokens it reads 1
    token but must have held 8192; 20000 tokens: (12·20000 + 36·8192) / 48 = 11144 tokens a layer,
    × 48 layers × 4096 bytes (K and V of 8 heads of 128, fp16)."""
    assert float(costs.kept_context(scout, C + 1)) == (12 * (C + 1) + 36 * C) / 48
    assert float(costs.kept_context(scout, 20000)) == 11144
    assert kv_cache_bytes(scout, 20000) == 2_190_999_552
    assert float(costs.kept_context(scout, 300)) == 300


def test_scout_attention_below_the_sliding_window_by_hand(scout):
    """At 20000 tokens (offset 3616 of the third chunk) decode reads (12·20000 + 36·3616)/48 = 7712
    tokens a layer against a window's 11144; the prefill's pairs are (12·2e8 + 36·73646592)/48 =
    105234944 against (12·2e8 + 36·130285568)/48 = 147714176 (C·s − C²/2)."""
    sliding = scout.model_copy(update={"local_attention": "sliding"})
    decode, decode_w = costs.decode_attention(scout, 3, 20000), costs.decode_attention(sliding, 3, 20000)
    assert float(decode.flops) / float(decode_w.flops) == pytest.approx(7712 / 11144, rel=1e-15)
    assert float(decode.kv_bytes) / float(decode_w.kv_bytes) == pytest.approx(7713 / 11145, rel=1e-15)
    prefill, prefill_w = costs.prefill_attention(scout, 2, 20000), costs.prefill_attention(sliding, 2, 20000)
    assert float(prefill.flops) / float(prefill_w.flops) == pytest.approx(105234944 / 147714176, rel=1e-15)
    assert float(prefill.kv_bytes) == float(prefill_w.kv_bytes)  # the prompt's KV is written alike


def test_sliding_models_read_what_they_keep():
    """Every catalog model but the chunked ones: reads and kept tokens are one count, as before."""
    contexts = np.array([1.0, 127.0, 128.0, 129.0, 4096.0, 40000.5])
    for path in sorted(CATALOG_DIR.glob("*.json")):
        model = load_model(path.stem)
        if model.local_attention == "chunked":
            continue
        np.testing.assert_array_equal(costs.attended_context(model, contexts), costs.kept_context(model, contexts))


def test_the_default_kind_keeps_the_hash(tiny):
    """The default kind, "sliding", is left out of the hash: gpt-oss keeps the hash it had before
    the field (computed on main before this change); chunked changes it."""
    assert load_model("gpt-oss-120b").sha256() == "55b307a8c5d9e8938836a1c8a80a84091f624cfd2f36f42b67dcd9dc45537909"
    assert _local(tiny, "chunked", 4, 1).sha256() != _local(tiny, "sliding", 4, 1).sha256()


@pytest.mark.parametrize("fields,needle", [({"local_attention": "chunked"}, "needs sliding_window_layers"),
                                           ({"local_attention": "strided"}, "local_attention")])
def test_bad_local_attention_refused(tiny, fields, needle):
    with pytest.raises(ValidationError, match=needle):
        ModelSpec.model_validate({**tiny.model_dump(), **fields})


def _scout_terms(prompt: int, gen: int, chunk: int = C, **kwargs):
    hw, eng = load_hardware("a100-80g"), resolve_engine("ideal", None)
    model = _local(load_model("llama-4-scout"), "chunked", chunk, 36)
    problem = make_problem(hw, model, make_workload(None, prompt_len=prompt, gen_len=gen), eng,
                           DEFAULT_OPTIONS, memory_limits(hw, DEFAULT_OPTIONS))
    return build_terms(problem, enumerate_modes(eng, (8,)), **kwargs)


def test_search_pieces_split_at_the_chunks():
    """Scout with chunks of 512: 1025 decode steps from 100 tokens cross two chunk starts (contexts
    513 and 1025), one in each half: the midpoint lies on the chord of the sawtooth, so pieces must
    start at the chunk edges (steps 412, 413, 924, 925) for the step sums to equal one column per
    step (without them the sums were 41% off at Scout's own 8192 and 16386 tokens)."""
    full, pieces = _scout_terms(100, 1026, 512), _scout_terms(100, 1026, 512, pieces=True)
    assert {412, 413, 924, 925} <= set(pieces.step_index.tolist())
    rng = np.random.default_rng(3)
    k = rng.integers(0, len(full.modes), 200)
    n = rng.integers(1, 8, 200).astype(float)
    m = rng.integers(0, full.expert_slots + 1, 200).astype(float) * full.ffn_on_gpu[k]
    z = rng.random(200) * full.mu[k] * n * full.attn_on_gpu[k]
    np.testing.assert_allclose(total_time_s(pieces, k, n, m, z, "generation"), total_time_s(full, k, n, m, z, "generation"),
                               rtol=1e-12)


def test_search_bound_blocks_do_not_straddle_a_chunk_start():
    """The bounds' blocks (Jensen: a block's size × its value at the mean context is at most its
    sum) hold for every lane coefficient when a chunk starts inside the decode (context 8193 of
    8000 … 8398): the block of steps 100-199 is cut at step 193."""
    full, blocks = _scout_terms(8000, 400), _scout_terms(8000, 400, blocks=4)
    assert len(blocks.step_weight) == 6 and list(blocks.step_weight) == [100, 92, 1, 7, 100, 99]
    for key in ("per_micro_batch_s", "per_micro_batch_kv_cpu_s", "per_layer_s"):
        dense, blocked = getattr(full, key).sum(axis=-1), getattr(blocks, key) @ blocks.step_weight
        assert np.all(blocked <= dense * (1 + 1e-12)), key


def test_read_breakpoints_by_hand(scout):
    assert costs.read_breakpoints(scout, 1000, 17385).tolist() == [C, C + 1, 2 * C, 2 * C + 1]
    assert costs.read_breakpoints(scout, C + 1, 2 * C - 1).tolist() == [C + 1]
    gpt = load_model("gpt-oss-120b")  # window 128: the reads stop growing there
    assert costs.read_breakpoints(gpt, 100, 200).tolist() == [128]
    assert costs.read_breakpoints(gpt, 129, 200).size == costs.read_breakpoints(load_model("mixtral"), 1, 10**6).size == 0


def test_search_bound_blocks_cut_at_the_window():
    """gpt-oss-120b on mtbench (contexts 77 … 203) passes its window of 128 at step 51, where the
    reads stop growing (a concave bend): the block of steps 32-63 is cut there, and every lane
    coefficient's block sum is at most its dense sum (uncut, the bound was 0.2% above it)."""
    hw, eng = load_hardware("a100-80g"), resolve_engine("ideal", None)
    problem = make_problem(hw, load_model("gpt-oss-120b"), make_workload("mtbench"), eng, DEFAULT_OPTIONS,
                           memory_limits(hw, DEFAULT_OPTIONS))
    modes = enumerate_modes(eng, (1, 64, 512, 4096))
    full, blocks = build_terms(problem, modes), build_terms(problem, modes, blocks=4)
    assert list(blocks.step_weight) == [32, 19, 13, 32, 31]
    for key in ("per_micro_batch_s", "per_micro_batch_kv_cpu_s", "per_layer_s"):
        dense, blocked = getattr(full, key).sum(axis=-1), getattr(blocks, key) @ blocks.step_weight
        assert np.all(blocked <= dense * (1 + 1e-12)), key
