"""gpupool under the tools data scientists already use: each integration is an extra (`gpupool[zenml]`) and
imports its tool only when used."""
