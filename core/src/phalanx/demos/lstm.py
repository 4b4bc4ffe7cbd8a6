"""A small LSTM language model on WikiText-2 with truncated backpropagation through time.

The hidden state is carried from one batch to the next (detached, so gradients stop at the batch
boundary) and reset each epoch; :class:`SequenceSampler` orders the data so that row ``i`` of each
batch continues row ``i`` of the previous one. The data is :class:`~phalanx.demos.transformer.WikiText2`
(see there for using it offline). Names and defaults are Lightning's demo's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader, Sampler

from phalanx.demos.transformer import WikiText2
from phalanx.module import Module

__all__ = ["LightningLSTM", "SequenceSampler", "SimpleLSTM"]


class SimpleLSTM(nn.Module):
    """Embedding -> dropout -> stacked LSTM -> dropout -> linear head; returns (log-probabilities per token, hidden)."""

    def __init__(
        self, vocab_size: int = 33278, ninp: int = 512, nhid: int = 512, nlayers: int = 4, dropout: float = 0.2
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(nhid, vocab_size)
        self.nlayers = nlayers
        self.nhid = nhid
        self.init_weights()

    def init_weights(self) -> None:
        """Embedding and head weights uniform in [-0.1, 0.1], head bias zero."""
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, input: Tensor, hidden: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        output, hidden = self.rnn(self.drop(self.encoder(input)), hidden)
        logits = self.decoder(self.drop(output)).view(-1, self.vocab_size)
        return F.log_softmax(logits, dim=1), hidden

    def init_hidden(self, batch_size: int) -> tuple[Tensor, Tensor]:
        """Zero hidden and cell states for ``batch_size`` rows, on the model's device and dtype."""
        weight = next(self.parameters())
        shape = (self.nlayers, batch_size, self.nhid)
        return weight.new_zeros(shape), weight.new_zeros(shape)


class SequenceSampler(Sampler[list[int]]):
    """Batches of ``batch_size`` indices in which row ``i`` walks one contiguous stretch of the data.

    The dataset is cut into ``batch_size`` stretches of ``len(dataset) // batch_size`` items; batch
    ``k`` holds item ``k`` of every stretch, so consecutive batches continue each other row by row.
    """

    def __init__(self, dataset: Sized, batch_size: int) -> None:
        super().__init__()
        self.dataset = dataset
        self.batch_size = batch_size
        self.chunk_size = len(dataset) // batch_size

    def __iter__(self) -> Iterator[list[int]]:
        usable = len(self.dataset) - len(self.dataset) % self.batch_size
        for offset in range(self.chunk_size):
            yield list(range(offset, usable, self.chunk_size))

    def __len__(self) -> int:
        return self.chunk_size


class LightningLSTM(Module):
    """:class:`SimpleLSTM` trained on :class:`WikiText2` with the hidden state carried across batches (SGD, lr 20)."""

    def __init__(self, vocab_size: int = 33278) -> None:
        super().__init__()
        self.model = SimpleLSTM(vocab_size=vocab_size)
        self.hidden: tuple[Tensor, Tensor] | None = None

    def on_train_epoch_end(self) -> None:
        self.hidden = None

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        inputs, target = batch
        if self.hidden is None:
            self.hidden = self.model.init_hidden(inputs.size(0))
        hidden = (self.hidden[0].detach(), self.hidden[1].detach())
        output, self.hidden = self.model(inputs, hidden)
        loss = F.nll_loss(output, target.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def prepare_data(self) -> None:
        WikiText2(download=True)

    def train_dataloader(self) -> DataLoader[tuple[Tensor, Tensor]]:
        dataset = WikiText2()
        return DataLoader(dataset, batch_sampler=SequenceSampler(dataset, batch_size=20))

    def configure_optimizers(self) -> Optimizer:
        return torch.optim.SGD(self.parameters(), lr=20.0)
