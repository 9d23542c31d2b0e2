"""tide.torch: a PyTorch model and optimizer made elastic without declaring tensors by hand.

    import tide.torch as tt
    plan = tt.Plan(pre="embed", blocks="blocks", post="head")  # pipeline pieces, by name
    with tt.Elastic(model, torch.optim.AdamW(model.parameters()), plan, job="gpt",
                    dp=2, pp=2, micro_batches=4) as el:
        for step in el.steps(1000):                # live resizes and recoveries in here
            x, y = batch(step)                     # the global batch of this step
            loss = el.train_step(el.shard(x), el.shard(y), F.cross_entropy)

Elastic declares every parameter and optimizer state tensor in the tide collection, joins
the job and rebinds the module and the optimizer after every resize; train_step runs the
micro-batches through this rank's pipeline stage (GPipe or 1F1B over rt.pp_exchange),
sums the gradients over the data-parallel group in flat buckets and applies the
optimizer. ColumnParallelLinear and RowParallelLinear are Megatron's tensor-parallel
linears. Checkpoints: el.checkpoint(root), el.checkpoint_every(root, n),
Elastic(..., resume=root) in any layout.
"""
from .elastic import Elastic, collection
from .layers import ColumnParallelLinear, RowParallelLinear, TPContext, local_features
from .plan import Plan

__all__ = ["ColumnParallelLinear", "Elastic", "collection", "Plan", "RowParallelLinear", "TPContext",
           "local_features"]
