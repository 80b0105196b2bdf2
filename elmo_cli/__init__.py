"""elmo-cli: ELMo biLMs in PyTorch, compatible with bilm-tf and allennlp files."""
