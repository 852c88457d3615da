"""Models gpurig's predict was never tuned on, as a user would pass them (``--model held_out_models:llama``),
to check predict's step and memory against a GPU (gpu_validation.py ``--held-out``).

Vision models come from torchvision (``torchvision.models:mobilenet_v2``), language models from Hugging Face
transformers, built from a config with random weights (nothing is downloaded). Each language model is wrapped
so that it takes token ids and returns its logits, the tensor a training loop's loss reads.

>>> HELD_OUT[0]
('torchvision.models:resnet18', '3x224x224', (128,))
"""

from torch import nn

TOKENS = 512

# (module:factory, per-sample input, batches per GPU)
HELD_OUT = [
    ("torchvision.models:resnet18", "3x224x224", (128,)),
    ("torchvision.models:mobilenet_v2", "3x224x224", (128,)),
    ("torchvision.models:efficientnet_b0", "3x224x224", (64,)),
    ("torchvision.models:densenet121", "3x224x224", (64,)),
    ("torchvision.models:convnext_tiny", "3x224x224", (64,)),
    ("torchvision.models:vit_b_16", "3x224x224", (64,)),
    ("held_out_models:distilbert", f"{TOKENS}:int64", (16,)),
    ("held_out_models:t5_small", f"{TOKENS}:int64", (16,)),
    ("held_out_models:llama", f"{TOKENS}:int64", (8,)),
]


class Logits(nn.Module):
    """A transformers model as a module of token ids to logits (``decoder`` also feeds them to the decoder)."""

    def __init__(self, model: nn.Module, decoder: bool = False):
        super().__init__()
        self.model, self.decoder = model, decoder

    def forward(self, ids):
        if self.decoder:
            return self.model(input_ids=ids, decoder_input_ids=ids).logits
        return self.model(input_ids=ids).logits


def distilbert() -> nn.Module:
    """DistilBERT-base (66 M parameters) for masked language modelling."""
    from transformers import DistilBertConfig, DistilBertForMaskedLM
    return Logits(DistilBertForMaskedLM(DistilBertConfig()))


def t5_small() -> nn.Module:
    """T5-small (60 M parameters), encoder and decoder, the same ids in both."""
    from transformers import T5Config, T5ForConditionalGeneration
    return Logits(T5ForConditionalGeneration(T5Config()), decoder=True)


def llama() -> nn.Module:
    """A Llama-style decoder of 12 layers, hidden size 1024, 32 000 tokens (about 230 M parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    return Logits(LlamaForCausalLM(LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                                               num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                                               max_position_embeddings=2048)))
