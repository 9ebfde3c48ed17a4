from django.db import models


class Order(models.Model):
    ref = models.CharField(max_length=100)


class Entry(models.Model):
    label = models.CharField(max_length=100)
