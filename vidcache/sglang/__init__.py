"""SGLang side: server configuration and the external multimodal processor plugin."""
