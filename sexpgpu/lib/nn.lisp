;;;; sexpgpu/nn -- neural network layers, losses and metrics, written over the tensor builtins.
;;;;
;;;; (require "sexpgpu/nn" :as nn), then nn:linear, nn:mlp, nn:cross-entropy ...

(%shadow "LAYER-NORM" "RMS-NORM" "DROPOUT")

;;; Argument checks: a wrong size is reported as the layer's own error (at the user's call,
;;; as every error raised in a standard module is), not as the op that would fail later

(defun %shape-text (shape)
  (format nil "(~{~a~^ ~})" shape))

(defun %check-size (who what n &optional (least 1))
  (unless (and (integerp n) (>= n least))
    (error "`~a`: ~a must be ~a integer, got ~s" who what (if (zerop least) "a non-negative" "a positive") n)))

(defun %check-last-axis (who x what d)
  (let ((shape (shape x)))
    (unless (and shape (eql (car (last shape)) d))
      (error "`~a`: the input has shape ~a, but this layer takes ~a=~a values on its last axis" who (%shape-text shape) what d))))

(defun %check-labels (who logits labels)
  (let ((want (butlast (shape logits))))
    (unless (equal (shape labels) want)
      (error "`~a`: labels of shape ~a do not fit logits of shape ~a: the labels need the logits' shape without its last axis, ~a"
             who (%shape-text (shape labels)) (%shape-text (shape logits)) (%shape-text want)))))

;;; Layers

(defmodel linear (d-in d-out &key (bias t))
  "y = x w + b, with w drawn from N(0, 1/d-in)."
  (%check-size "linear" "d-in" d-in)
  (%check-size "linear" "d-out" d-out)
  (defparam w (d-in d-out) :init (normal :std (/ 1.0 (sqrt d-in))))
  (defparam b (d-out) :init :zeros :when bias)
  (forward (x)
    (%check-last-axis "linear" x "d-in" d-in)
    (if b (+ (matmul x w) b) (matmul x w))))

(defun %layer-sizes (sizes)
  (loop for (a b) on sizes while b collect (list a b)))

(defmodel mlp (d-in d-hidden d-out &key (depth 1) (activation #'relu))
  "DEPTH hidden layers of width D-HIDDEN with ACTIVATION between them."
  (%check-size "mlp" "depth" depth 0)
  (defpart layers (let ((sizes (append (list d-in)
                                       (make-list depth :initial-element d-hidden)
                                       (list d-out))))
                    (%repeat-list (mapcar (lambda (pair)
                                            (lambda () (linear (first pair) (second pair))))
                                          (%layer-sizes sizes)))))
  (forward (x)
    (let ((n (length (%models layers))))
      (loop for layer in (%models layers)
            for i from 1
            do (setq x (%call-model layer (list x))) (when (< i n) (setq x (funcall activation x))))
      x)))

(defmodel embedding (vocab d &key (std 0.02))
  "Rows of a (vocab d) table picked by integer ids."
  (%check-size "embedding" "vocab" vocab)
  (%check-size "embedding" "d" d)
  (defparam table (vocab d) :init (normal :std std))
  (forward (ids)
    (take table ids)))

(defmodel layer-norm (d &key (eps 1e-5))
  "Normalize the last axis to zero mean and unit variance, then scale and shift."
  (%check-size "layer-norm" "d" d)
  (defparam weight (d) :init :ones)
  (defparam bias (d) :init :zeros)
  (forward (x)
    (%check-last-axis "layer-norm" x "d" d)
    (%layer-norm x :eps eps :weight weight :bias bias)))

(defmodel rms-norm (d &key (eps 1e-6))
  "Divide the last axis by its root mean square, then scale."
  (%check-size "rms-norm" "d" d)
  (defparam weight (d) :init :ones)
  (forward (x)
    (%check-last-axis "rms-norm" x "d" d)
    (%rms-norm x :eps eps :weight weight)))

(defun dropout (x rate)
  "Zero each element with probability RATE while training (scaling the rest by 1/(1-RATE));
the identity in evaluation. The mask is Philox keyed by the seed, the step and the node."
  (if (or (zerop rate) (not (training-p)))
      x
      (/ (where (dropout-mask (shape x) rate) x 0.0) (- 1.0 rate))))

(defun %divisors-near (d n)
  "The divisors of D nearest to N, below and above it."
  (remove nil (list (loop for k downfrom (min (1- n) d) to 1 when (zerop (mod d k)) return k)
                    (loop for k from (1+ n) to d when (zerop (mod d k)) return k))))

(defun %check-heads (d heads)
  (%check-size "causal-attention" "d" d)
  (%check-size "causal-attention" "heads" heads)
  (unless (zerop (mod d heads))
    (error "`causal-attention`: d=~a is not divisible by heads=~a; use a number of heads that divides ~a, such as ~{~a~^ or ~}"
           d heads d (%divisors-near d heads))))

(defmodel causal-attention (d heads &key (dropout 0.0))
  "Multi-head self-attention where position i sees positions 0..i (the diagonal is always
visible): one attention op, fused on a device; with DROPOUT on the weights, its parts."
  (%check-heads d heads)
  (defpart wq (linear d d))
  (defpart wk (linear d d))
  (defpart wv (linear d d))
  (defpart wo (linear d d))
  (forward (x)
    (unless (= (rank x) 3)
      (error "`causal-attention`: the input must be (batch seq d), got shape ~a" (%shape-text (shape x))))
    (%check-last-axis "causal-attention" x "d" d)
    (destructuring-bind (b s width) (shape x)
      (declare (ignore width))
      (let* ((hd (floor d heads))
             (split (lambda (y) (reshape y (list b s heads hd))))
             (q (funcall split (wq x)))
             (k (funcall split (wk x)))
             (v (funcall split (wv x)))
             (heads-first (lambda (y) (permute y '(0 2 1 3))))
             (scores (lambda () (/ (matmul (funcall heads-first q) (transpose (funcall heads-first k))) (sqrt (float hd)))))
             (weights (lambda () (dropout (softmax (where (tril-mask s) (funcall scores) -1e9) :axis -1) dropout)))
             (mixed (if (zerop dropout) (attention q k v :causal t) (permute (matmul (funcall weights) (funcall heads-first v)) '(0 2 1 3)))))
        (wo (reshape mixed (list b s d)))))))

(defmodel transformer-block (d heads &key (mlp-ratio 4) (dropout 0.0))
  "Pre-norm block: x + attention(norm(x)), then x + mlp(norm(x)), with GELU in the MLP."
  (defpart norm1 (layer-norm d))
  (defpart attn (causal-attention d heads :dropout dropout))
  (defpart norm2 (layer-norm d))
  (defpart mlp (mlp d (* mlp-ratio d) d :activation #'gelu))
  (forward (x)
    (let ((x (+ x (dropout (attn (norm1 x)) dropout)))) (+ x (dropout (mlp (norm2 x)) dropout)))))

;;; Losses and metrics

(defun cross-entropy (logits labels &key (label-smoothing 0.0) ignore-index)
  "Mean negative log-likelihood of integer LABELS under softmax(LOGITS) over the last axis.
With LABEL-SMOOTHING e the target is (1-e) one-hot + e/classes; rows whose label is
IGNORE-INDEX count neither in the sum nor in the mean (torch semantics)."
  (%check-labels "cross-entropy" logits labels)
  (let* ((classes (car (last (shape logits))))
         (logp (log-softmax logits :axis -1))
         (hot (one-hot labels classes))
         (target (if (zerop label-smoothing)
                     hot
                     (+ (* hot (- 1.0 label-smoothing)) (/ label-smoothing classes))))
         (nll (neg (sum (* logp target) :axis -1))))
    (if ignore-index
        (let ((keep (cast (/= labels ignore-index) :f32)))
          (/ (sum (* nll keep)) (maximum (sum keep) 1.0)))
        (mean nll))))

(defun accuracy (logits labels)
  "Fraction of rows whose largest logit is at the label."
  (%check-labels "accuracy" logits labels)
  (mean (cast (= (argmax logits :axis -1) (cast labels :i32)) :f32)))

(defun mse (predictions targets)
  "Mean squared error."
  (when (and (tensorp predictions) (tensorp targets) (not (equal (shape predictions) (shape targets))))
    (error "`mse`: predictions of shape ~a and targets of shape ~a differ; give both the same shape (reshape one)"
           (%shape-text (shape predictions)) (%shape-text (shape targets))))
  (mean (square (- predictions targets))))
