"""A small transformer language model on WikiText-2, for trying strategies on a real-shaped model.

The model is PyTorch's ``nn.Transformer`` (encoder and decoder, batch first) between a token
embedding with sinusoidal positions and a linear head over the vocabulary; the data is the
WikiText-2 training text cut into blocks of ``block_size`` tokens, each paired with the same block
shifted by one token. The names and defaults are Lightning's demo's.

:class:`WikiText2` downloads its text (about 11 MB) on first use. Offline, place the file
yourself: ``<data_dir>/wikitext-2.txt`` (the ``train.txt`` of PyTorch's word_language_model
example); with ``download=False`` nothing is fetched and a missing file is an error that says so.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from phalanx.module import Module

__all__ = ["Dictionary", "LightningTransformer", "PositionalEncoding", "Transformer", "WikiText2", "tokenize"]

#: Where :meth:`WikiText2.download` fetches the text from.
WIKITEXT2_URL = "https://raw.githubusercontent.com/pytorch/examples/main/word_language_model/data/wikitext-2/train.txt"


class PositionalEncoding(nn.Module):
    """Adds the sinusoidal position signal of "Attention Is All You Need" to embeddings, then dropout.

    The table (``max_len`` x ``dim``) is built on first use, on the input's device.
    """

    def __init__(self, dim: int, dropout: float = 0.1, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.dim = dim
        self.max_len = max_len
        self.pe: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self.pe is None or self.pe.device != x.device:
            self.pe = self._table(x.device)
        return self.dropout(x + self.pe[:, : x.size(1)])

    def _table(self, device: torch.device) -> Tensor:
        position = torch.arange(self.max_len, dtype=torch.float, device=device).unsqueeze(1)
        frequency = torch.exp(torch.arange(0, self.dim, 2, device=device).float() * (-math.log(10000.0) / self.dim))
        table = torch.zeros(self.max_len, self.dim, device=device)
        table[:, 0::2] = torch.sin(position * frequency)
        table[:, 1::2] = torch.cos(position * frequency)
        return table.unsqueeze(0)


class Transformer(nn.Module):
    """Embedding + positions -> ``nn.Transformer`` -> linear head; returns log-probabilities, one row per token."""

    def __init__(
        self,
        vocab_size: int = 33278,
        ninp: int = 200,
        nhead: int = 2,
        nhid: int = 200,
        nlayers: int = 2,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.embedding = nn.Embedding(vocab_size, ninp)
        self.transformer = nn.Transformer(
            d_model=ninp,
            nhead=nhead,
            num_encoder_layers=nlayers,
            num_decoder_layers=nlayers,
            dim_feedforward=nhid,
            dropout=dropout,
            batch_first=True,
        )
        self.decoder = nn.Linear(ninp, vocab_size)
        self.ninp = ninp
        self.vocab_size = vocab_size
        self.src_mask: Tensor | None = None

    def generate_square_subsequent_mask(self, size: int) -> Tensor:
        """A causal mask: ``-inf`` above the diagonal (future tokens), 0 elsewhere."""
        return torch.triu(torch.full((size, size), float("-inf")), diagonal=1)

    def forward(self, inputs: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor:
        length = inputs.size(1)
        if self.src_mask is None or self.src_mask.size(0) != length:
            self.src_mask = self.generate_square_subsequent_mask(length).to(inputs.device)
        if mask is None:
            mask = self.src_mask
        scale = math.sqrt(self.ninp)
        source = self.pos_encoder(self.embedding(inputs) * scale)
        shifted = self.pos_encoder(self.embedding(target) * scale)
        output = self.decoder(self.transformer(source, shifted, tgt_mask=mask))
        return F.log_softmax(output, dim=-1).view(-1, self.vocab_size)


class Dictionary:
    """Word <-> index, in order of first appearance."""

    def __init__(self) -> None:
        self.word2idx: dict[str, int] = {}
        self.idx2word: list[str] = []

    def add_word(self, word: str) -> int:
        """The word's index, adding it first when it is new."""
        if word not in self.word2idx:
            self.word2idx[word] = len(self.idx2word)
            self.idx2word.append(word)
        return self.word2idx[word]

    def __len__(self) -> int:
        return len(self.idx2word)


def tokenize(path: Path) -> tuple[Tensor, Dictionary]:
    """All words of the text file at ``path`` as one tensor of indices (``<eos>`` ends each line), and the dictionary.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    if not os.path.exists(path):
        msg = f"tokenize: {path} does not exist"
        raise FileNotFoundError(msg)
    dictionary = Dictionary()
    lines: list[Tensor] = []
    with open(path, encoding="utf8") as handle:
        for line in handle:
            ids = [dictionary.add_word(word) for word in [*line.split(), "<eos>"]]
            lines.append(torch.tensor(ids, dtype=torch.int64))
    return torch.cat(lines), dictionary


class WikiText2(Dataset[tuple[Tensor, Tensor]]):
    """WikiText-2's training text as ``(block, block shifted by one token)`` pairs of ``block_size`` tokens.

    Args:
        data_dir: Folder of ``wikitext-2.txt``.
        block_size: Tokens per item.
        download: Fetch the file when it is missing (needs the network).
    """

    def __init__(self, data_dir: Path = Path("./data"), block_size: int = 35, download: bool = True) -> None:
        super().__init__()
        self.path = Path(data_dir) / "wikitext-2.txt"
        if download:
            self.download(self.path)
        if not self.path.exists():
            msg = (
                f"WikiText2: {self.path} does not exist. Fix: pass download=True (needs the network), or place "
                f"PyTorch's word_language_model train.txt ({WIKITEXT2_URL}) there."
            )
            raise FileNotFoundError(msg)
        self.data, self.dictionary = tokenize(self.path)
        self.block_size = block_size

    @property
    def vocab_size(self) -> int:
        """Distinct words in the text, ``<eos>`` included."""
        return len(self.dictionary)

    def __len__(self) -> int:
        return len(self.data) // self.block_size - 1

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        start = index * self.block_size
        return self.data[start : start + self.block_size], self.data[start + 1 : start + self.block_size + 1]

    @staticmethod
    def download(destination: Path) -> None:
        """Fetch the text to ``destination`` unless it is there already.

        Raises:
            OSError: The download failed (offline, say); the message says where to put the file instead.
        """
        import urllib.request

        destination = Path(destination)
        if destination.exists():
            return
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = destination.with_suffix(".part")
        try:
            urllib.request.urlretrieve(WIKITEXT2_URL, partial)
        except OSError as error:
            partial.unlink(missing_ok=True)
            msg = f"WikiText2: downloading {WIKITEXT2_URL} failed ({error}). Offline, place that file at {destination}."
            raise OSError(msg) from error
        partial.replace(destination)


class LightningTransformer(Module):
    """:class:`Transformer` trained with next-token NLL and SGD (lr 0.1) on :class:`WikiText2`."""

    def __init__(self, vocab_size: int = 33278) -> None:
        super().__init__()
        self.model = Transformer(vocab_size=vocab_size)

    def forward(self, inputs: Tensor, target: Tensor) -> Tensor:
        return self.model(inputs, target)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        inputs, target = batch
        return F.nll_loss(self(inputs, target), target.view(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=0.1)

    def prepare_data(self) -> None:
        WikiText2(download=True)

    def train_dataloader(self) -> DataLoader[tuple[Tensor, Tensor]]:
        return DataLoader(WikiText2())
