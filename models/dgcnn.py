"""DGCNN classifier (Wang et al., "Dynamic Graph CNN for Learning on Point Clouds", ACM TOG 2019)
whose neighbour graphs are pcops's kNN and whose neighbour gathers are pcops's group.

Shapes, channels last throughout (as models/pointnet2.py):
    B batch, N points, k neighbours per point, C channels, K classes.

An EdgeConv layer, as the paper's section 3.1 defines it, on per-point features x [B,N,C]:
    graph    the k nearest neighbours of every point among the same cloud's points, by the
             squared Euclidean distance between their *current* features (D = C: 3 for the
             first layer, 64 / 64 / 128 after it): the graph is rebuilt at every layer
             ("dynamic")                                                  idx [B,N,k]
    edges    for each point i and neighbour j: (x_j - x_i, x_i)           [B,N,k,2C]
    MLP      a shared Linear (= the paper's 1x1 convolution) -> BatchNorm -> LeakyReLU(0.2)
                                                                          [B,N,k,C']
    pool     max over the k edges of each point                           [B,N,C']

The classifier (the paper's figure 3, top): EdgeConv 64, 64, 128, 256 with k = 20; the four
outputs concatenated (512 channels) -> shared Linear to 1024 -> BatchNorm -> LeakyReLU;
global max and average pool concatenated (2048) -> Linear 512 -> BN -> LeakyReLU -> dropout 0.5
-> Linear 256 -> BN -> LeakyReLU -> dropout 0.5 -> Linear K.

The graph carries no gradient (it is a choice of indices); the gradients flow through the
gathered features (pcops.group's backward) and x_i.

knn_backend picks who builds the graph, so the same network (same weights, same layers) can be
timed on both:
    "pcops"  pcops.knn(x, x, k): exact squared distances, sorted by (distance, index), any D;
    "torch"  the plain-PyTorch way of DGCNN's reference code: the full pairwise matrix
             -|x_i|^2 + 2 x_i.x_j - |x_j|^2 by one matmul, then topk. Computed in float32 (float64
             for float64 input) outside autocast, as that code runs in float32; the expansion
             loses the small distances to cancellation, so near ties can come out in another
             order (pcops's answer is the exact one).
Both give the same graph wherever the k-th and (k+1)-th distances are well separated; the gather,
edge features and everything after the graph are the same code.
"""
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

import pcops

__all__ = ["KNN_BACKENDS", "knn_graph", "EdgeConv", "DGCNN", "dgcnn"]

KNN_BACKENDS = ("pcops", "torch")


def knn_graph(x: Tensor, k: int, backend: str = "pcops") -> Tensor:
    """The k nearest neighbours of every point of x [B,N,D] among the points of its own cloud
    (the point itself included, at distance 0) -> idx [B,N,k] int64, nearest first."""
    if backend == "pcops":
        return pcops.knn(x, x, k)[1]
    if backend == "torch":
        with torch.autocast(x.device.type, enabled=False):
            x = x.to(torch.promote_types(x.dtype, torch.float32))
            sq = (x * x).sum(-1)                                              # [B,N]
            neg_dist2 = 2 * torch.matmul(x, x.transpose(1, 2)) - sq.unsqueeze(2) - sq.unsqueeze(1)
            return neg_dist2.topk(k, dim=-1).indices                          # [B,N,k]
    raise ValueError(f"dgcnn: knn_backend must be one of {KNN_BACKENDS}, got {backend!r}")


class EdgeConv(nn.Module):
    """One EdgeConv layer: kNN graph on the input features, edge features (x_j - x_i, x_i),
    shared Linear -> BatchNorm -> LeakyReLU(0.2), max over the k edges.

    forward(x [B,N,C], idx [B,N,k] or None) -> [B,N,out_channels]; idx None builds the graph
    with knn_backend (a given idx is used as it is: tests, or a graph shared between layers).
    """

    def __init__(self, in_channels: int, out_channels: int, k: int = 20, knn_backend: str = "pcops"):
        super().__init__()
        if k < 1:
            raise ValueError(f"dgcnn: k must be >= 1, got {k}")
        if knn_backend not in KNN_BACKENDS:
            raise ValueError(f"dgcnn: knn_backend must be one of {KNN_BACKENDS}, got {knn_backend!r}")
        self.k, self.knn_backend = k, knn_backend
        self.in_channels, self.out_channels = in_channels, out_channels
        self.linear = nn.Linear(2 * in_channels, out_channels, bias=False)
        self.bn = nn.BatchNorm1d(out_channels)
        self.act = nn.LeakyReLU(0.2)

    def forward(self, x: Tensor, idx: Optional[Tensor] = None) -> Tensor:
        B, N, _ = x.shape
        if idx is None:
            if N < self.k:
                raise ValueError(f"dgcnn: an EdgeConv with k={self.k} needs at least {self.k} points, got {N}")
            idx = knn_graph(x.detach(), self.k, self.knn_backend)              # [B,N,k]
        k = idx.shape[-1]
        neighbours = pcops.group(x, idx)                                      # [B,N,k,C]  x_j
        centre = x.unsqueeze(2).expand_as(neighbours)                         # [B,N,k,C]  x_i
        edges = torch.cat([neighbours - centre, centre], dim=-1)              # [B,N,k,2C]
        h = self.linear(edges.reshape(-1, edges.shape[-1]))                   # [B*N*k,C']
        h = self.act(self.bn(h))      # BatchNorm over B, N and k, as BatchNorm2d after a 1x1 conv
        return h.view(B, N, k, self.out_channels).amax(dim=2)                 # [B,N,C']


class DGCNN(nn.Module):
    """The DGCNN classifier (see the module docstring).

    Args:
        num_classes: K.
        k: neighbours of every EdgeConv (paper: 20).
        widths: EdgeConv output channels (paper: 64, 64, 128, 256).
        embed: channels of the shared layer before the global pooling (paper: 1024).
        dropout: dropout of the head (paper: 0.5).
        knn_backend: "pcops" (default) or "torch" (the plain-PyTorch matmul + topk); settable
            later through the attribute of the same name.
        in_channels: channels of the input points (3: xyz).

    forward(xyz [B,N,in_channels], features=None) -> logits [B,K]. (features is accepted for the
    signature of the PointNet++ classifiers and must be None: DGCNN takes the points alone.)
    """

    def __init__(self, num_classes: int = 40, k: int = 20, widths: Sequence[int] = (64, 64, 128, 256),
                 embed: int = 1024, dropout: float = 0.5, knn_backend: str = "pcops", in_channels: int = 3):
        super().__init__()
        self.k = k
        self.convs = nn.ModuleList()
        channels = in_channels
        for width in widths:
            self.convs.append(EdgeConv(channels, width, k, knn_backend))
            channels = width
        self.embed = nn.Sequential(nn.Linear(sum(widths), embed, bias=False), nn.BatchNorm1d(embed),
                                   nn.LeakyReLU(0.2))
        self.head = nn.Sequential(
            nn.Linear(2 * embed, 512, bias=False), nn.BatchNorm1d(512), nn.LeakyReLU(0.2), nn.Dropout(dropout),
            nn.Linear(512, 256, bias=False), nn.BatchNorm1d(256), nn.LeakyReLU(0.2), nn.Dropout(dropout),
            nn.Linear(256, num_classes),
        )

    @property
    def knn_backend(self) -> str:
        return self.convs[0].knn_backend

    @knn_backend.setter
    def knn_backend(self, backend: str) -> None:
        if backend not in KNN_BACKENDS:
            raise ValueError(f"dgcnn: knn_backend must be one of {KNN_BACKENDS}, got {backend!r}")
        for conv in self.convs:
            conv.knn_backend = backend

    def forward(self, xyz: Tensor, features: Optional[Tensor] = None) -> Tensor:
        if features is not None:
            raise ValueError("dgcnn: takes the points alone (features must be None)")
        B, N, _ = xyz.shape
        x, layers = xyz, []
        for conv in self.convs:
            x = conv(x)                                    # [B,N,64] [B,N,64] [B,N,128] [B,N,256]
            layers.append(x)
        h = torch.cat(layers, dim=-1)                      # [B,N,512]
        h = self.embed(h.reshape(B * N, -1)).view(B, N, -1)                   # [B,N,1024]
        pooled = torch.cat([h.amax(dim=1), h.mean(dim=1)], dim=-1)            # [B,2048]
        return self.head(pooled)                                              # [B,K]


def dgcnn(num_classes: int = 40, **kwargs) -> DGCNN:
    """The paper's DGCNN classifier (k = 20, EdgeConv 64-64-128-256, 1024, head 512-256-K)."""
    return DGCNN(num_classes, **kwargs)
