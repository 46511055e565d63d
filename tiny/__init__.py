"""The tiny offline world: the model kit, tiny CLIP training, scripted tool calls, and the demo's stages."""
