"""What the training command leaves beside its checkpoints: metrics.csv and curves.png."""
import csv
import os

__all__ = ["write_metrics", "plot_curves"]


def write_metrics(out, history):
    with open(os.path.join(out, "metrics.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(history[0]))
        w.writeheader()
        w.writerows(history)


def plot_curves(out, history, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ep = [h["epoch"] for h in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(ep, [h["train_loss"] for h in history], label="train loss")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("loss")
    ax1.legend()
    ax2.plot(ep, [h["train_acc"] for h in history], label="train acc")
    if history[-1]["val_acc"] is not None:  # not under --val-split none
        ax2.plot(ep, [h["val_acc"] for h in history], label="val acc")
        ax2.plot(ep, [h["val_mean_class_acc"] for h in history], "--", label="val mean class acc")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("accuracy (%)")
    ax2.grid(alpha=0.3)
    ax2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=120)
    plt.close(fig)
