"""machinery/mismatch.py: the engine/trainer gap on hand-made log-probs against formulas written here, the rollout
correction's weights and dropped sequences, and on a real run the stale-weights control."""
import math

import pytest
import torch

import config
import grpo
import train
from grpo import TrainSeq
from machinery import mismatch
from test_train import SMALL, metrics, parse

NAN = float("nan")


def seq(mask, old, rollout, spliced=None):
    return TrainSeq(input_ids=list(range(len(mask))), loss_mask=list(mask), advantage=1.0, old_logp=list(old),
                    rollout_logp=list(rollout), spliced=None if spliced is None else list(spliced))


def batch():
    # token 0 of each is the prompt (mask 0, junk log-probs that must not count); spliced tokens in the second
    return [seq([0, 1, 1, 1, 0], [NAN, -1.0, -2.0, -0.5, 7.0], [0.0, -1.1, -1.0, -0.5, 0.0]),
            seq([0, 1, 1, 1], [NAN, -0.3, -3.0, -1.0], [0.0, -0.3, -2.0, -2.5], spliced=[0, 0, 1, 1])]


def test_measure_equals_the_formulas_ordinary_and_spliced_apart():
    m = mismatch.measure(batch())
    ordinary, spliced = [-1.0 + 1.1, -2.0 + 1.0, 0.0, 0.0], [-3.0 + 2.0, -1.0 + 2.5]  # log pi_old - log pi_rollout
    for name, d in (("", ordinary), ("_spliced", spliced)):
        assert m[f"mismatch_tokens{name}"] == len(d)
        assert m[f"mismatch_kl{name}"] == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / len(d), rel=1e-12)
        assert m[f"mismatch_abs{name}"] == pytest.approx(sum(abs(x) for x in d) / len(d), rel=1e-12)
        assert m[f"mismatch_abs{name}_max"] == pytest.approx(max(abs(x) for x in d), rel=1e-12)
        assert m[f"mismatch_out{name}"] == sum(not 0.5 <= math.exp(x) <= 2.0 for x in d) / len(d)
    assert m["mismatch_out"] == 0.25 and m["mismatch_out_spliced"] == 1.0
    tiny = mismatch.measure([seq([0, 1], [0.0, -1.0], [0.0, -1.0 - 1e-6])])["mismatch_kl"]
    assert tiny == pytest.approx(0.5e-12, rel=1e-3)  # float64: a KL of 1e-12 does not round to 0


def test_token_is_weights_are_truncated_ratios():
    b = batch()
    out = mismatch.correct(b, "token", 2.0)
    for t in b:
        want = [min(math.exp(o - r), 2.0) if m else 1.0 for m, o, r in zip(t.loss_mask, t.old_logp, t.rollout_logp)]
        assert t.is_weight.tolist() == pytest.approx(want, rel=1e-6)
    assert out == dict(rollout_is_clipped=pytest.approx(1 / 6))  # of 6 loss tokens, exp(1.5) passes the cap of 2
    assert [t.loss_mask for t in b] == [t.loss_mask for t in batch()]  # nothing dropped


@pytest.mark.parametrize("lower,dropped", [(0.0, [True, False, True]), (0.2, [False, False, True])])
def test_seq_masking_drops_sequences_whose_ratio_leaves_the_bounds(lower, dropped):
    b = batch() + [seq([0, 1, 1], [0.0, -1.0, -1.0], [0.0, -2.0, -1.5])]  # sequence ratios e^-0.9, e^0.5, e^1.5
    tokens = [sum(t.loss_mask) for t in b]  # 3, 3, 2
    out = mismatch.correct(b, "seq", 2.0, lower)  # lower 0: 1/2
    assert [not any(t.loss_mask) for t in b] == dropped
    assert out["rollout_is_dropped_seqs"] == pytest.approx(sum(dropped) / 3)
    assert out["rollout_is_dropped"] == pytest.approx(sum(n for n, x in zip(tokens, dropped) if x) / 8)
    assert all(t.is_weight is None for t in b)  # masked, not weighted
    # a dropped sequence leaves the loss's normaliser too, whatever the aggregation
    assert grpo.loss_normaliser(b, "token-mean") == sum(n for n, x in zip(tokens, dropped) if not x)
    assert grpo.loss_normaliser(b, "seq-mean-token-mean") == 3 - sum(dropped)


def test_bad_values_get_clear_errors(capsys):
    with pytest.raises(SystemExit):
        parse(*SMALL, "--rollout-is", "tis")
    assert "tis" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(*SMALL, "--rollout-is", "token", "--rollout-is-threshold", "0.5")
    assert "--rollout-is-threshold must be > 1" in capsys.readouterr().err
    assert config.FAITHFUL["rollout_is"] == "none"
    assert parse(*SMALL, "--rollout-is", "seq", "--faithful").grpo.rollout_is == "none"


def test_stale_engine_weights_are_caught_and_said_once(tmp_path, monkeypatch, capsys):
    """The negative control: the weight push skipped after each update, so step 2 samples from step 0's weights
    (the engine reads the policy's modules, but its packed copies of the linear weights stay step 0's).
    The tiny random model never gets a reward right, so its advantages are 0: AdamW's decoupled weight decay,
    set large, is what moves them. Step 1 (engine and trainer on the same weights) stays under the bound
    of an fp32 run, 1e-9 (measured: about 1e-13); step 2 passes the warning threshold. With --rollout-is token
    on, so that the correction's path (old log-probs of the whole batch before the update) runs too."""
    monkeypatch.setattr(train, "push_weights", lambda *a, **k: None)
    train.main(parse(*SMALL, "--out-dir", str(tmp_path), "--run-name", "stale", "--steps", "2",
                     "--weight-decay", "300", "--rollout-is", "token"))
    m, out = metrics(tmp_path / "stale"), capsys.readouterr().out
    assert m[1]["mismatch_kl"] < 1e-9 and m[1]["mismatch_tokens"] > 0 and m[1]["rollout_is_clipped"] == 0
    assert m[2]["mismatch_kl"] > config.Grpo.mismatch_warn_kl
    warnings = [x for x in out.splitlines() if x.startswith("warning: step")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: step 2:") and "stale" in warnings[0]
    assert out.index("step    1 |") < out.index(warnings[0]) < out.index("step    2 |")
    assert "| mismatch_kl " in out


def test_seq_masking_clamps_the_sum_as_verl_does_not_each_token():
    """veRL's sequence rejection clamps the summed log-ratio to [-20, 20], not each token's: tokens at +25 and -22
    sum to +3, a ratio of e^3 past the threshold of 2, so the sequence is dropped (each token clamped first, the
    sum would be 0 and the sequence kept)."""
    b = [seq([0, 1, 1], [0.0, 0.0, -22.0], [0.0, -25.0, 0.0])]
    assert mismatch.correct(b, "seq", 2.0)["rollout_is_dropped_seqs"] == 1.0
    assert b[0].loss_mask == [0, 0, 0]
    b = [seq([0, 1, 1], [0.0, 0.0, -40.0], [0.0, -40.0, 0.0])]  # +40 and -40: a sum of 0, kept
    assert mismatch.correct(b, "seq", 2.0)["rollout_is_dropped_seqs"] == 0.0
