"""The training step the history scripts and docs measure: a 2-layer Llama of hidden size 64, batch 2 × 32."""

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def build():
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=128, vocab_size=256)
    model = AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, 256, (2, 32))

    def step():
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return model, optimizer, batch, step
