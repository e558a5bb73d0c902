"""Small test models: each returns (model, sample_input, loss_fn)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SmallCNN(nn.Module):
    """BatchNorm, dropout, a residual add, a concat, max-pool, in-place ReLU. kernel 1: on CPU
    a 3x3 convolution's backward has twice its output's bytes in scratch (NOTE [Allocation
    events]), which sets the least peak where that scratch is counted, and no variant lowers
    it; with 1x1 convolutions a masked ReLU's or a max-pool's backward sets it."""

    def __init__(self, kernel: int = 3) -> None:
        super().__init__()
        conv = lambda c_in, c_out: nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2)  # noqa: E731
        self.stem = nn.Sequential(conv(3, 8), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.block = nn.Sequential(conv(8, 8), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                                   conv(8, 8), nn.BatchNorm2d(8))
        self.drop = nn.Dropout(0.3)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Sequential(conv(16, 16), nn.ReLU(inplace=True),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x):
        y = self.stem(x)
        z = F.relu(self.block(y) + y, inplace=True)
        z = torch.cat([self.drop(z), y], dim=1)
        return self.head(self.pool(z))


class TransformerBlock(nn.Module):
    """LayerNorm, SDPA attention with dropout, GELU MLP with dropout, residuals."""

    def __init__(self, d: int = 32, heads: int = 4, p: float = 0.1) -> None:
        super().__init__()
        self.heads, self.p = heads, p
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d),
                                 nn.Dropout(p))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0,
                                           is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class PoolCNN(nn.Module):
    """A ResNet-like stem (conv, BN, ReLU, 3x3/2 max-pool), then wider convolutions at the
    lower resolution, whose backward holds the step's peak while the stem's indices wait."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 7, padding=3), nn.BatchNorm2d(16), nn.ReLU(),
                                 nn.MaxPool2d(3, 2, 1), nn.Conv2d(16, 64, 3, padding=1),
                                 nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


class MLP(nn.Module):
    """Linear layers (3-d input, so they lower to mm on a view), ReLU, dropout, GELU."""

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        hidden = [m for _ in range(depth - 1) for m in (nn.Linear(128, 128), nn.GELU())]
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.2), *hidden,
                                 nn.Linear(128, 10))

    def forward(self, x):
        return self.net(x)


class ShapeOnlyNet(nn.Module):
    """A convolution, then an op whose backward reads its input for the shape only: a frozen
    convolution (no weight gradient), average pooling, or adaptive average pooling (to 7x7,
    which stays _adaptive_avg_pool2d); or a trainable convolution, whose backward reads its
    input for the shape only in its input step (NOTE [Conv backward split]). Without dropping
    that input, the op's backward holds three maps at once (input, output gradient, input
    gradient); nothing else holds as many. The first convolution is 1x1: a 3x3 one's backward
    has twice its output's bytes in scratch on CPU (NOTE [Allocation events]), more than the
    three maps."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 1)
        self.op = {"frozen_conv": lambda: nn.Conv2d(8, 8, 3, padding=1).requires_grad_(False),
                   "conv": lambda: nn.Conv2d(8, 8, 3, padding=1),
                   "avgpool": lambda: nn.AvgPool2d(2),
                   "adaptive_avgpool": lambda: nn.AdaptiveAvgPool2d((7, 7))}[kind]()
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.op(self.conv(x)).mean((2, 3)))


class SiluCNN(nn.Module):
    """conv-BN-SiLU blocks (EfficientNet's pattern): SiLU keeps its input, the BatchNorm's
    output, so a BatchNorm that rebuilds its input from its output needs nothing more kept."""

    def __init__(self, width: int = 16, depth: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for k in range(depth):
            layers += [nn.Conv2d(3 if k == 0 else width, width, 3, padding=1, bias=False),
                       nn.BatchNorm2d(width), nn.SiLU()]
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(width, 10)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


def silu_cnn():
    return SiluCNN(), torch.randn(4, 3, 16, 16), lambda out: out.sum()


def small_cnn(kernel: int = 3):
    return SmallCNN(kernel), torch.randn(4, 3, 16, 16), lambda out: out.sum()


def pool_cnn():
    return PoolCNN(), torch.randn(4, 3, 32, 32), lambda out: out.sum()


def mlp():
    return MLP(), torch.randn(8, 64, 64), lambda out: out.sum()


def shape_only_net(kind: str):
    return ShapeOnlyNet(kind), torch.randn(4, 3, 16, 16), lambda out: out.sum()


def transformer_block():
    return TransformerBlock(), torch.randn(2, 16, 32), lambda out: out.sum()


def gpt2_tiny(dropout: float = 0.1):
    """Dropout 0 puts the fused CPU attention kernel in the graph (with dropout, the products)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=500,
                     use_cache=False, bos_token_id=1, eos_token_id=2, attn_pdrop=dropout,
                     resid_pdrop=dropout, embd_pdrop=dropout)
    model = GPT2LMHeadModel(cfg)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied, as real GPT-2
    return model, {"input_ids": torch.randint(3, 500, (2, 32))}, lambda out: out.logits.sum()


def bert_tiny():
    from transformers import BertConfig, BertModel
    cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                     intermediate_size=128, vocab_size=500, max_position_embeddings=64)
    return (BertModel(cfg), {"input_ids": torch.randint(3, 500, (2, 32))},
            lambda out: out.last_hidden_state.sum() + out.pooler_output.sum())


def bart_tiny():
    """An encoder-decoder whose returned encoder output feeds the cross-attention (NOTE [Saved
    values the backward does not read] in monet_opt/rewrite.py)."""
    from transformers import BartConfig, BartForConditionalGeneration
    ids = torch.randint(0, 100, (2, 12))
    cfg = BartConfig(vocab_size=100, d_model=16, encoder_layers=1, decoder_layers=1,
                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                     decoder_ffn_dim=32, max_position_embeddings=32, dropout=0.1,
                     attention_dropout=0.1, activation_dropout=0.1, pad_token_id=1,
                     bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                     attn_implementation="eager")
    return (BartForConditionalGeneration(cfg).train(),
            {"input_ids": ids, "labels": ids[:, :8].clone(), "use_cache": False},
            lambda out: out.loss)


def resnet18_small():
    import torchvision
    return torchvision.models.resnet18(num_classes=10), torch.randn(2, 3, 64, 64), \
        lambda out: out.sum()


def mobilenet_v2_small():
    import torchvision
    return torchvision.models.mobilenet_v2(num_classes=10), torch.randn(2, 3, 64, 64), \
        lambda out: out.sum()


ALL = [small_cnn, transformer_block, gpt2_tiny, bert_tiny, resnet18_small, mobilenet_v2_small]


def frozen_mlp() -> nn.Module:
    return tiny_mlp().requires_grad_(False)


def tiny_mlp() -> nn.Module:
    """A model-only factory (the CLI's MODULE:FACTORY form): input (batch, 8)."""
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 4))


def tiny_dropout_mlp() -> nn.Module:
    """tiny_mlp with dropout: on CPU its step holds a generator state beyond the measured ops."""
    return nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 64),
                         nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))
