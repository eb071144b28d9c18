"""DeviceLoader: keeps a whole data set on the device (ModelNet40 is 9843 x 736 x 3) and yields
batches by indexing it: no DataLoader workers, no host-to-device copy per step."""
from typing import Callable, Optional

import torch

from .augment import random_subset
from .clouds import PointClouds

__all__ = ["DeviceLoader"]


class DeviceLoader:
    """Batches (xyz[B,N,3], labels[B], valid[B]) of a PointClouds held whole on `device`.

    Training (train=True): each epoch the shapes are shuffled by a permutation drawn from
    (seed, epoch), the same in every process (what DistributedSampler draws); step k takes the
    global batch of B x world shapes perm[k*B*world : (k+1)*B*world], every process reduces each
    cloud of it to a random subset of N points in random order and runs `augment` on it with
    `generator` (seeded alike in every process), then keeps its rows rank, rank + world, ...
    So the processes together train on exactly the batches, points and augmentations that one
    process with batch B x world would: the data split costs world x the augmentation of a batch
    (a few element-wise kernels) and no host sync (the permutation is copied to the device once
    per epoch). Every batch is full (the remainder is dropped).

    Evaluation (train=False): this process's shapes are i = rank, rank + world, ... in order,
    each cloud keeps its first N points, and the last batch is padded to the full batch size by
    repeating shape 0 with valid = False, so every batch has the same shape (no recompilation
    under torch.compile); count only the valid rows. vote_batches() yields V copies per batch.
    """

    def __init__(self, data: PointClouds, batch_size: int, num_points: int, device, *, train: bool,
                 augment: Optional[Callable] = None, generator: Optional[torch.Generator] = None,
                 rank: int = 0, world_size: int = 1, seed: int = 0):
        if num_points > data.points.shape[1]:
            raise ValueError(f"--points {num_points} but the data has {data.points.shape[1]} points per shape")
        self.data = data.to(device)
        self.batch_size, self.num_points, self.train = batch_size, num_points, train
        self.augment, self.generator = augment, generator
        self.rank, self.world_size, self.seed, self.epoch = rank, world_size, seed, 0
        if train and len(data) // world_size < batch_size:
            raise ValueError(f"{len(data)} shapes over {world_size} process(es) do not fill one batch of {batch_size}")

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        if self.train:
            return len(self.data) // (self.batch_size * self.world_size)
        return -(-len(range(self.rank, len(self.data), self.world_size)) // self.batch_size)

    def _permutation(self):
        """The epoch's shuffle on the device (DistributedSampler's draw: randperm seeded seed + epoch)."""
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        perm = torch.randperm(len(self.data), generator=g)
        dev = self.data.points.device
        if dev.type == "cuda":
            return perm.pin_memory().to(dev, non_blocking=True)
        return perm.to(dev)

    def _eval_order(self):
        dev = self.data.points.device
        order = torch.arange(self.rank, len(self.data), self.world_size, device=dev)
        n_valid, pad = len(order), len(self) * self.batch_size - len(order)
        order = torch.cat([order, order.new_zeros(pad)])
        valid = torch.arange(len(order), device=dev) < n_valid
        return order, valid

    def __iter__(self):
        B, W = self.batch_size, self.world_size
        if self.train:
            order = self._permutation()
            valid = torch.ones(B, dtype=torch.bool, device=order.device)
            for k in range(len(self)):
                sel = order[k * B * W:(k + 1) * B * W]                          # the global batch
                xyz = random_subset(self.data.points[sel], self.num_points, self.generator)  # [BW,N,3]
                if self.augment is not None:
                    xyz = self.augment(xyz, self.generator)
                if W > 1:
                    sel, xyz = sel[self.rank::W], xyz[self.rank::W]             # this process's rows
                yield xyz, self.data.labels[sel], valid
            return
        order, valid = self._eval_order()
        for k in range(len(self)):
            sel = order[k * B:(k + 1) * B]
            yield self.data.points[sel][:, :self.num_points], self.data.labels[sel], valid[k * B:(k + 1) * B]

    def vote_batches(self, votes: int, augment: Optional[Callable] = None, generator=None):
        """Evaluation batches with V copies of each shape: ([xyz_0, ..., xyz_{V-1}], labels, valid).
        Copy 0 is the plain evaluation batch (the first N points); copies 1..V-1 are random subsets
        of N of the stored points, in random order, passed through `augment`."""
        B = self.batch_size
        order, valid = self._eval_order()
        for k in range(len(self)):
            sel = order[k * B:(k + 1) * B]
            full = self.data.points[sel]                                        # [B,P,3]
            copies = [full[:, :self.num_points]]
            for _ in range(1, votes):
                xyz = random_subset(full, self.num_points, generator)
                copies.append(augment(xyz, generator) if augment is not None else xyz)
            yield copies, self.data.labels[sel], valid[k * B:(k + 1) * B]
