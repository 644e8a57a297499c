"""One rank whose DataLoader workers (argv[1]: spawn, forkserver or fork) record their binding."""

import sys

from probe_record import record

if __name__ == "__main__":
    record("rank")  # before import torch: libgomp then pins the main thread to the compute place

import torch
from torch.utils.data import DataLoader, Dataset


class Data(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        record("worker")
        return torch.zeros(1)


if __name__ == "__main__":
    for _ in DataLoader(Data(), batch_size=1, num_workers=2, multiprocessing_context=sys.argv[1]):
        pass
