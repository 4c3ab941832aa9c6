"""Strategy plugins: how the model is wrapped and how many processes drive which devices."""
