"""Lightning DDP on CPU with 2 devices; each rank and each DataLoader worker records its real binding.

argv[1]: the DataLoader's multiprocessing context (spawn, forkserver or fork).
"""

import os
import sys

from probe_record import record

record("start")  # before any import of torch or Lightning: what the startup hook left

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class Data(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        info = torch.utils.data.get_worker_info()
        record("worker", worker=info.id if info else None)
        return torch.randn(4)


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: torch.Tensor, idx: int) -> torch.Tensor:
        if idx == 0:
            record("rank", local_rank=self.trainer.local_rank, global_rank=self.trainer.global_rank,
                   torch_threads=torch.get_num_threads())
        return self.layer(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    loader = DataLoader(Data(), batch_size=2, num_workers=2, multiprocessing_context=sys.argv[1],
                        persistent_workers=False)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), loader)
    os.environ.get("LOCAL_RANK")
