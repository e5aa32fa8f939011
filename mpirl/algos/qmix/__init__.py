"""QMIX over PettingZoo, with MAC-PO loss weights and AccMER reuse sampling as two settings."""
