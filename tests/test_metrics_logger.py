"""MetricsLogger on resume: metrics.jsonl and TensorBoard each describe one run (every step once)."""

import glob
import os
import struct

import numpy as np

from mimesis_jax.train.metrics import MetricsLogger, read_metrics


def _records(path):
    """TFRecord framing: uint64 length, uint32 crc, payload, uint32 crc."""
    with open(path, "rb") as f:
        data = f.read()
    i = 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        yield data[i + 12:i + 12 + n]
        i += 12 + n + 4


def _tensorboard_view(logdir, tag):
    """(step, value) of `tag` as TensorBoard's reader shows them: files in name (= creation) order, and a
    SessionLog START at step s hides every earlier event of step >= s (its purge rule for restarted runs)."""
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    shown = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for raw in _records(path):
            ev = Event.FromString(raw)
            if ev.HasField("session_log") and ev.session_log.status == SessionLog.START:
                shown = [(s, v) for s, v in shown if s < ev.step]
            for val in ev.summary.value:
                if val.tag == tag:
                    shown.append((ev.step, round(val.simple_value, 6)))
    return shown


def test_resume_writes_each_step_once(tmp_path):
    import time

    wd = str(tmp_path)
    log = MetricsLogger(wd, total_steps=4, start_step=0, tensorboard=True, progress_bar=False, stage="t")
    for s in range(1, 5):  # the interrupted run got to step 4; its checkpoint is at step 2
        log.log(s, {"loss": float(s)})
    log.close()
    time.sleep(1.1)  # event file names carry the creation second: the resumed run's file sorts after
    log = MetricsLogger(wd, total_steps=4, start_step=2, tensorboard=True, progress_bar=False, stage="t")
    for s in (3, 4):
        log.log(s, {"loss": 10.0 + s})
    log.close()
    assert [(r["step"], r["loss"]) for r in read_metrics(wd)] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)]
    assert _tensorboard_view(os.path.join(wd, "tensorboard"), "train/loss") == [
        (1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)]


def test_progress_bar_shows_no_token_rate_a_stage_does_not_measure(tmp_path, capsys):
    log = MetricsLogger(str(tmp_path), total_steps=2, start_step=0, tensorboard=False, progress_bar=True,
                        stage="agentrl")
    log.log(1, {"loss": 0.5})
    log.bar.refresh()
    assert "tok_s" not in str(log.bar)
    log.log(2, {"loss": 0.5, "tokens_per_s": 1234.0})
    assert "tok_s=1234" in str(log.bar)
    log.close()


def test_a_hist_list_reaches_tensorboard_as_a_histogram_of_its_counts(tmp_path):
    """`staleness_hist/<k>` = tokens at staleness k = 0, 1, 2: TensorBoard gets one histogram with one bucket per
    value, with the count, sum and sum of squares of the values the counts stand for (a NumPy count of the
    expanded values), and no scalar of them."""
    from tensorboardX.proto.event_pb2 import Event

    counts = [3, 0, 5]
    log = MetricsLogger(str(tmp_path), total_steps=1, start_step=0, tensorboard=True, progress_bar=False)
    log.log(1, {"loss": 0.5, **{f"staleness_hist/{k}": c for k, c in enumerate(counts)}})
    log.close()
    assert [read_metrics(str(tmp_path))[0][f"staleness_hist/{k}"] for k in range(3)] == counts
    values = np.repeat(np.arange(len(counts)), counts)
    (path,) = glob.glob(os.path.join(tmp_path, "tensorboard", "events.out.tfevents.*"))
    hists = [(Event.FromString(raw).step, v.histo) for raw in _records(path)
             for v in Event.FromString(raw).summary.value if v.tag == "train/staleness_hist"]
    assert len(hists) == 1 and hists[0][0] == 1
    tags = {v.tag for raw in _records(path) for v in Event.FromString(raw).summary.value}
    assert tags == {"train/loss", "train/staleness_hist"}
    h = hists[0][1]
    assert (h.min, h.max, h.num, h.sum, h.sum_squares) == (values.min(), values.max(), len(values), values.sum(),
                                                           (values ** 2).sum())
    assert list(h.bucket) == counts
    # bucket k holds the values in (k - 1/2, k + 1/2]
    assert [int(((values > lim - 1) & (values <= lim)).sum()) for lim in h.bucket_limit] == counts
