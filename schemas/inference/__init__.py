"""The inference contract: the HTTP protocol (SGLang's shapes), its torch-free client, the result types and the
errors. Every service may import it; `inference_svc` implements it. Nothing here imports torch.
"""
