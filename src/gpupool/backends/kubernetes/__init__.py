"""The kubernetes backend: gpupool's core decides, and this turns decisions into Pods bound to nodes.

The kubernetes client is imported here only, so `pip install gpupool` works without it
(`pip install 'gpupool[kubernetes]'` brings it).
"""
