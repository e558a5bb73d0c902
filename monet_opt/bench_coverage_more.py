"""bench_coverage's diffusion models (diffusers, built from configs) and timm models, with
dropout and stochastic depth on. Each build returns (model in train mode, sample input); a
tuple input is passed as positional arguments."""
from __future__ import annotations

import torch

DIFFUSION = ("sd_unet", "ddpm_unet", "dit")
TIMM = {  # name: (batch, image size); MaxViT and CoAtNet need their own size
    "vit_small_patch16_224": (2, 64), "convnext_atto": (2, 64), "resnet50d": (2, 64),
    "efficientnet_b0": (2, 64), "mobilenetv3_small_100": (2, 64), "regnety_002": (2, 64),
    "coatnet_nano_rw_224": (1, 224), "maxvit_nano_rw_256": (1, 256)}


def build(name: str):
    torch.manual_seed(0)
    if name.startswith("timm_"):
        import timm
        batch, size = TIMM[name[5:]]
        kwargs = {"img_size": size} if name.startswith("timm_vit") else {}
        model = timm.create_model(name[5:], num_classes=10, drop_path_rate=0.1, **kwargs)
        return model.train(), torch.randn(batch, 3, size, size)
    import diffusers
    steps = torch.tensor([10, 500])
    if name == "sd_unet":  # Stable Diffusion's UNet: cross-attention on a text encoding
        unet = diffusers.UNet2DConditionModel(
            sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
            block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
            attention_head_dim=8, norm_num_groups=8)
        return (_Sample(unet, "encoder_hidden_states").train(),
                (torch.randn(2, 4, 16, 16), steps, torch.randn(2, 7, 32)))
    if name == "ddpm_unet":  # DDPM's UNet: self-attention at one resolution, dropout
        unet = diffusers.UNet2DModel(
            sample_size=32, in_channels=3, out_channels=3, layers_per_block=1,
            block_out_channels=(32, 64, 64), norm_num_groups=8, dropout=0.1,
            down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"))
        return _Sample(unet).train(), (torch.randn(2, 3, 32, 32), steps)
    if name == "dit":  # a diffusion transformer, class-conditioned (adaptive layer norm)
        dit = diffusers.DiTTransformer2DModel(
            num_attention_heads=4, attention_head_dim=16, in_channels=4, num_layers=2,
            sample_size=16, patch_size=2, norm_num_groups=8, num_embeds_ada_norm=1000,
            dropout=0.1)
        return (_Sample(dit, "class_labels").train(),
                (torch.randn(2, 4, 16, 16), steps, torch.tensor([1, 2])))
    raise ValueError(f"unknown model {name!r}")


class _Sample(torch.nn.Module):
    """A diffusers model called on (noisy sample, timesteps[, condition]), returning `.sample`;
    `condition` names the keyword the condition is passed as."""

    def __init__(self, model: torch.nn.Module, condition: str | None = None) -> None:
        super().__init__()
        self.model, self.condition = model, condition

    def forward(self, x, steps, condition=None):
        extra = {} if self.condition is None else {self.condition: condition}
        return self.model(x, timestep=steps, **extra).sample
