"""DeviceLoader: keeps a whole data set on the device (ModelNet40 is 9843 x 736 x 3) and yields
batches by indexing it: no DataLoader workers, no host-to-device copy per step."""
from typing import Callable, Optional

import torch
from torch.utils.data import DistributedSampler

from .augment import random_subset
from .clouds import PointClouds

__all__ = ["DeviceLoader"]


class DeviceLoader:
    """Batches (xyz[B,N,3], labels[B], valid[B]) of a PointClouds held whole on `device`.

    Training (train=True): each epoch a DistributedSampler (seeded, set_epoch) shuffles the
    shapes and gives this process its 1/world share; every batch is full (the remainder is
    dropped), each cloud is reduced to a random subset of N points in random order and
    `augment` runs on the device with `generator`.

    Evaluation (train=False): this process's shapes are i = rank, rank + world, ... in order,
    each cloud keeps its first N points, and the last batch is padded to the full batch size by
    repeating shape 0 with valid = False, so every batch has the same shape (no recompilation
    under torch.compile); count only the valid rows.
    """

    def __init__(self, data: PointClouds, batch_size: int, num_points: int, device, *, train: bool,
                 augment: Optional[Callable] = None, generator: Optional[torch.Generator] = None,
                 rank: int = 0, world_size: int = 1, seed: int = 0):
        if num_points > data.points.shape[1]:
            raise ValueError(f"--points {num_points} but the data has {data.points.shape[1]} points per shape")
        self.data = data.to(device)
        self.batch_size, self.num_points, self.train = batch_size, num_points, train
        self.augment, self.generator = augment, generator
        self.rank, self.world_size = rank, world_size
        self.sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True,
                                          seed=seed, drop_last=True) if train else None
        if train and len(self.sampler) < batch_size:
            raise ValueError(f"{len(data)} shapes over {world_size} process(es) do not fill one batch of {batch_size}")

    def set_epoch(self, epoch: int) -> None:
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        if self.train:
            return len(self.sampler) // self.batch_size
        return -(-len(range(self.rank, len(self.data), self.world_size)) // self.batch_size)

    def __iter__(self):
        dev = self.data.points.device
        if self.train:
            order = torch.tensor(list(self.sampler), dtype=torch.long).to(dev, non_blocking=True)
            valid = torch.ones(len(order), dtype=torch.bool, device=dev)
        else:
            order = torch.arange(self.rank, len(self.data), self.world_size, device=dev)
            n_valid, pad = len(order), len(self) * self.batch_size - len(order)
            order = torch.cat([order, order.new_zeros(pad)])
            valid = torch.arange(len(order), device=dev) < n_valid
        for k in range(len(self)):
            sel = order[k * self.batch_size:(k + 1) * self.batch_size]
            xyz = self.data.points[sel]                                    # [B,P,3]
            if self.train:
                xyz = random_subset(xyz, self.num_points, self.generator)  # [B,N,3]
                if self.augment is not None:
                    xyz = self.augment(xyz, self.generator)
            else:
                xyz = xyz[:, :self.num_points]
            yield xyz, self.data.labels[sel], valid[k * self.batch_size:(k + 1) * self.batch_size]
