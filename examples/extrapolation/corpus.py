"""The corpus: the help files of Debian's vim-runtime package, as bytes.

The files are read in sorted order and concatenated (one newline between files, so that the
last line of one file does not run into the first line of the next). The split is by bytes:
the first 90% of the concatenation is for training, the last 10% is held out for evaluation.
Byte-level tokens: the vocabulary is the 256 byte values, no tokenizer.
"""

import glob
import os

import torch

CORPUS_PACKAGE = "vim-runtime"
DEFAULT_GLOB = "/usr/share/vim/vim*/doc"


class CorpusError(Exception):
    """The corpus is missing or unusable; the message says what to do."""


def find_corpus_dir(explicit=None):
    """The directory of vim help files: `explicit` if given, else the newest
    /usr/share/vim/vim*/doc that holds *.txt files."""
    if explicit is not None:
        if not glob.glob(os.path.join(explicit, "*.txt")):
            raise CorpusError(
                f"no *.txt files in --corpus-dir {explicit!r} (expected the vim help files of "
                f"Debian's {CORPUS_PACKAGE} package, e.g. /usr/share/vim/vim90/doc)")
        return explicit
    # The environment variable exists for the tests (a machine without vim-runtime).
    pattern = os.environ.get("EXTRAPOLATION_CORPUS_GLOB", DEFAULT_GLOB)
    candidates = [d for d in glob.glob(pattern) if glob.glob(os.path.join(d, "*.txt"))]
    if not candidates:
        raise CorpusError(
            f"the corpus is missing: no vim help files in {pattern}/*.txt; install Debian's "
            f"{CORPUS_PACKAGE} package (as root: apt-get install {CORPUS_PACKAGE}, or "
            f"bash scripts/setup-debian.sh) or point --corpus-dir at a folder of .txt files")

    def version_key(path):
        # vim90 < vim91 < vim100: compare the digits as a number.
        digits = "".join(ch for ch in os.path.basename(os.path.dirname(path)) if ch.isdigit())
        return (int(digits) if digits else -1, path)

    return max(candidates, key=version_key)


def load_corpus(corpus_dir):
    """All *.txt files of `corpus_dir`, sorted by name, concatenated as a uint8 tensor."""
    parts = []
    files = sorted(glob.glob(os.path.join(corpus_dir, "*.txt")))
    for path in files:
        with open(path, "rb") as f:
            parts.append(f.read())
    data = b"\n".join(parts)
    if len(data) < 100_000:
        raise CorpusError(
            f"the corpus in {corpus_dir} has only {len(data)} bytes in {len(files)} files; "
            f"expected the few MB of Debian's {CORPUS_PACKAGE} help files")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8), files


def split_corpus(data, heldout_fraction=0.1):
    """(train, heldout): the first 90% and the last 10% of the bytes."""
    cut = int(len(data) * (1.0 - heldout_fraction))
    return data[:cut], data[cut:]


def training_offsets(train_len, seq_len, batch, steps, seed):
    """Window starts for every step, [steps, batch], from their own seeded generator, so that
    every position scheme sees exactly the same batches in the same order."""
    if train_len < seq_len + 2:
        raise CorpusError(f"training text of {train_len} bytes is shorter than L + 1 = "
                          f"{seq_len + 1}")
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, train_len - seq_len - 1, (steps, batch), generator=gen)


def batch_at(data, starts, length):
    """Inputs and targets [batch, length] for windows of length + 1 bytes at `starts`."""
    idx = starts[:, None] + torch.arange(length + 1)[None, :]
    window = data[idx].long()
    return window[:, :-1], window[:, 1:]


def evaluation_ends(heldout_len, max_len, windows):
    """End positions (exclusive) of the evaluation windows in the held-out text.

    Every evaluation length n uses windows [end - n, end) of the same ends, so the last L tokens
    of every window are the same tokens at every length: only the context before them grows.
    The ends are spread evenly and at least max_len + 1 apart, so the longest windows do not
    overlap; `windows` is lowered to what fits."""
    span = heldout_len - (max_len + 1)
    if span < 0:
        raise CorpusError(f"held-out text of {heldout_len} bytes is shorter than the longest "
                          f"evaluation window ({max_len + 1} bytes)")
    fit = span // (max_len + 1) + 1
    count = max(1, min(windows, fit))
    stride = span // (count - 1) if count > 1 else 0
    return [max_len + 1 + k * stride for k in range(count)]
