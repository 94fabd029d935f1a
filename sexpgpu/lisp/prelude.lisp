;;;; prelude.lisp -- loaded before every file.
;;;;
;;;; Everything here is written in SexpGPU Lisp over the evaluator's special forms and the
;;;; builtins. Names starting with % are internal: macros below expand into them, but user
;;;; files cannot see them.

;;; ------------------------------------------------------------------------------------------
;;; Definitions

(%defmacro defmacro (name lambda-list &body body)
  (%documented name 'function body `(%defmacro ,name ,lambda-list ,@(%body-without-doc body))))

(%defun '%body-without-doc
  (lambda (body)
    (if (if (stringp (car body)) (cdr body) nil)
        (cdr body)
        body)))

(%defun '%documented
  ;; FORM, after recording BODY's leading docstring as NAME's documentation of KIND
  (lambda (name kind body form)
    (if (if (stringp (car body)) (cdr body) nil)
        `(progn (%set-documentation ',name ',kind ,(car body)) ,form)
        form)))

(%defun '%split-body
  ;; (values declarations forms): the leading docstring is dropped, declarations kept apart
  (lambda (body)
    (let ((decls nil))
      (setq body (%body-without-doc body))
      (tagbody
       next
         (if (if (consp (car body)) (%name= (car (car body)) "DECLARE") nil)
             (progn (setq decls (cons (car body) decls))
                    (setq body (cdr body))
                    (go next))))
      (values (reverse decls) body))))

(defmacro defun (name lambda-list &body body)
  (%documented
   name 'function body
   (multiple-value-call
       (lambda (decls forms)
         (if (consp name)
             `(%defsetf-function ',(car (cdr name))
                                 (lambda ,lambda-list ,@decls (block ,(car (cdr name)) ,@forms)))
             `(%defun ',name (lambda ,lambda-list ,@decls (block ,name ,@forms)))))
     (%split-body body))))

(defmacro defvar (name &optional (value nil value-p) (doc nil doc-p))
  (%documented name 'variable (if doc-p (list doc nil) nil)
               (if value-p
                   `(%defvar ',name (if (boundp ',name) (symbol-value ',name) ,value) nil)
                   `(progn (%declare-special ',name) ',name))))

(defmacro defparameter (name value &optional (doc nil doc-p))
  (%documented name 'variable (if doc-p (list doc nil) nil) `(%defvar ',name ,value t)))

(defmacro defconstant (name value &optional (doc nil doc-p))
  (%documented name 'variable (if doc-p (list doc nil) nil) `(%defconstant ',name ,value)))

(defconstant lambda-list-keywords
  '(&allow-other-keys &aux &body &environment &key &optional &rest &whole))

;;; ------------------------------------------------------------------------------------------
;;; Control

(defun %progn-form (body)
  ;; the body as one form, the way SBCL's when/unless expand
  (if (cdr body) `(progn ,@body) (car body)))

(defmacro when (test &body body)
  `(if ,test ,(%progn-form body)))

(defmacro unless (test &body body)
  `(if ,test nil ,(%progn-form body)))

(defmacro and (&rest forms)
  (if (null forms)
      t
      (if (null (cdr forms))
          (car forms)
          `(if ,(car forms) (and ,@(cdr forms)) nil))))

(defmacro or (&rest forms)
  (if (null forms)
      nil
      (if (null (cdr forms))
          (car forms)
          (let ((g (gensym "OR")))
            `(let ((,g ,(car forms)))
               (if ,g ,g (or ,@(cdr forms))))))))

(defmacro cond (&rest clauses)
  (if (null clauses)
      nil
      (let ((clause (car clauses)))
        (if (null (cdr clause))
            (let ((g (gensym "COND")))
              `(let ((,g ,(car clause)))
                 (if ,g ,g (cond ,@(cdr clauses)))))
            `(if ,(car clause)
                 (progn ,@(cdr clause))
                 (cond ,@(cdr clauses)))))))

(defmacro return (&optional value)
  `(return-from nil ,value))

(defmacro prog1 (first &body body)
  (let ((g (gensym "PROG1")))
    `(let ((,g ,first)) ,@body ,g)))

(defmacro prog2 (first second &body body)
  `(progn ,first (prog1 ,second ,@body)))

(defmacro multiple-value-bind (vars form &body body)
  (let ((rest (gensym "REST")))
    `(multiple-value-call (lambda (&optional ,@vars &rest ,rest)
                            (declare (ignore ,rest))
                            ,@body)
       ,form)))

(defmacro multiple-value-list (form)
  `(multiple-value-call #'list ,form))

(defmacro multiple-value-setq (&environment env vars form)
  ;; returns the primary value of FORM, whatever the variables. A variable that is a symbol
  ;; macro is a place: its subforms are evaluated before FORM, as (setf (values ...) form) does
  (if (some (lambda (v) (nth-value 1 (macroexpand-1 v env))) vars)
      `(values (setf (values ,@vars) ,form))
      (let ((temps (%gensym-list (length vars))) (g (gensym "PRIMARY")))
        `(multiple-value-bind (,g ,@(cdr temps)) ,form
           ,@(mapcar (lambda (v tmp) `(setq ,v ,tmp)) vars (cons g (cdr temps)))
           ,g))))

(defmacro nth-value (n form)
  `(nth ,n (multiple-value-list ,form)))

(defmacro psetq (&rest pairs)
  (let ((bindings nil) (sets nil))
    (tagbody
     next
       (if pairs
           (let ((g (gensym "PSETQ")))
             (setq bindings (cons (list g (car (cdr pairs))) bindings))
             (setq sets (cons `(setq ,(car pairs) ,g) sets))
             (setq pairs (cdr (cdr pairs)))
             (go next))))
    `(let ,(reverse bindings) ,@(reverse sets) nil)))

(defun %case-test (keys keyform)
  ;; the test of a case clause whose keys designate KEYS (an atom is a list of one)
  (cond ((null keys) nil)
        ((atom keys) `(eql ,keyform ',keys))
        ((null (cdr keys)) `(eql ,keyform ',(car keys)))
        (t `(member ,keyform ',keys))))

(defun %otherwise-p (keys)
  (or (eq keys t) (%name= keys "OTHERWISE")))

(defun %case-clauses (g clauses otherwise-allowed)
  ;; cond clauses of case-like CLAUSES; with OTHERWISE-ALLOWED a last t or otherwise clause
  ;; catches the rest, else t and otherwise are ordinary keys (ecase, ccase)
  (mapcar (lambda (clause)
            (unless (consp clause) (error 'program-error :format-control "case: ~s is not a clause" :format-arguments (list clause)))
            (if (and otherwise-allowed (%otherwise-p (car clause)))
                `(t nil ,@(cdr clause))
                `(,(%case-test (car clause) g) nil ,@(cdr clause))))
          clauses))

(defun %case-keys (clauses)
  (mapcan (lambda (c) (if (listp (car c)) (copy-list (car c)) (list (car c)))) clauses))

(defmacro case (keyform &rest clauses)
  (let ((g (gensym "KEY")))
    `(let ((,g ,keyform))
       (cond ,@(%case-clauses g clauses t)))))

(defun %correctable (place make-body)
  ;; ccase, ctypecase, check-type: MAKE-BODY, given the error form for a failed test, makes
  ;; the test; the error offers a store-value restart that stores into PLACE and tests again
  (if (null place)
      (funcall make-body (lambda (error-form) error-form))
      (let ((block (gensym "CORRECTABLE")) (again (gensym "AGAIN")) (v (gensym "VALUE")))
        `(block ,block
           (tagbody
              ,again
              (return-from ,block
                ,(funcall make-body
                          (lambda (error-form)
                            `(restart-case ,error-form
                               (store-value (,v)
                                 :report (lambda (s) (format s "Supply a new value of ~s." ',place))
                                 (setf ,place ,v)
                                 (go ,again)))))))))))

(defun %ecase-expansion (keyform clauses name &optional place)
  (let ((g (gensym "KEY")) (keys (%case-keys clauses)))
    (%correctable
     place
     (lambda (wrap)
       `(let ((,g ,keyform))
          (cond ,@(%case-clauses g clauses nil)
                (t ,(funcall wrap
                             `(error 'type-error
                                     :format-control ,(concatenate 'string "~s fell through " name ": expected one of ~{~s~^, ~}")
                                     :format-arguments (list ,g ',keys)
                                     :datum ,g :expected-type '(member ,@keys))))))))))

(defmacro ecase (keyform &rest clauses)
  (%ecase-expansion keyform clauses "ecase"))

(defmacro ccase (keyplace &rest clauses)
  ;; like ecase, with a store-value restart that sets KEYPLACE and tries again
  (%ecase-expansion keyplace clauses "ccase" keyplace))

(defmacro typecase (keyform &rest clauses)
  (let ((g (gensym "KEY")))
    `(let ((,g ,keyform))
       (cond ,@(mapcar (lambda (clause)
                         (if (%otherwise-p (car clause))
                             `(t nil ,@(cdr clause))
                             `((typep ,g ',(car clause)) nil ,@(cdr clause))))
                       clauses)))))

(defun %etypecase-expansion (keyform clauses name &optional place)
  (let ((g (gensym "KEY")) (types (mapcar #'car clauses)))
    (%correctable
     place
     (lambda (wrap)
       `(let ((,g ,keyform))
          (cond ,@(mapcar (lambda (clause) `((typep ,g ',(car clause)) nil ,@(cdr clause))) clauses)
                (t ,(funcall wrap
                             `(error 'type-error
                                     :format-control ,(concatenate 'string "~s fell through " name ": expected one of the types ~{~s~^, ~}")
                                     :format-arguments (list ,g ',types)
                                     :datum ,g :expected-type '(or ,@types))))))))))

(defmacro etypecase (keyform &rest clauses)
  (%etypecase-expansion keyform clauses "etypecase"))

(defmacro ctypecase (keyplace &rest clauses)
  (%etypecase-expansion keyplace clauses "ctypecase" keyplace))

;;; ------------------------------------------------------------------------------------------
;;; prog, types, hash-table iteration

(defmacro prog (bindings &body body)
  (multiple-value-bind (decls forms) (%split-body body)
    `(block nil (let ,bindings ,@decls (tagbody ,@forms)))))

(defmacro prog* (bindings &body body)
  (multiple-value-bind (decls forms) (%split-body body)
    `(block nil (let* ,bindings ,@decls (tagbody ,@forms)))))

(defmacro deftype (name lambda-list &body body)
  ;; the type's expander takes the type's arguments; an optional argument defaults to *
  (let ((args (mapcar (lambda (p)
                        (if (and (symbolp p) (not (member p '(&optional &rest &key &aux &whole &environment &body))))
                            p
                            p))
                      lambda-list)))
    `(progn (%deftype ',name (lambda ,(%star-defaults args) ,@(%body-without-doc body))) ',name)))

(defun %star-defaults (lambda-list)
  ;; deftype's optional parameters default to *
  (let ((optional nil) (out nil))
    (dolist (p lambda-list (reverse out))
      (cond ((member p '(&optional &key)) (setq optional t) (push p out))
            ((member p '(&rest &aux &body)) (setq optional nil) (push p out))
            ((and optional (symbolp p)) (push (list p ''*) out))
            (t (push p out))))))

(defmacro with-hash-table-iterator ((name table) &body body)
  ;; (NAME) gives (values t key value) for each entry, then nil
  (let ((entries (gensym "ENTRIES")) (entry (gensym "ENTRY")))
    `(let ((,entries (%hash-entries ,table)))
       (macrolet ((,name ()
                    '(if ,entries
                         (let ((,entry (car ,entries)))
                           (setq ,entries (cdr ,entries))
                           (values t (car ,entry) (cdr ,entry)))
                         nil)))
         ,@body))))

(defmacro defsetf (access &rest rest)
  ;; a setf expander for (ACCESS args...): the arguments are evaluated once, left to right,
  ;; then the new value. The short form (defsetf access update [doc]) stores with the function
  ;; or macro UPDATE as (update args... value); the long form
  ;; (defsetf access lambda-list (store...) body) runs BODY to make the storing form.
  (if (and rest (symbolp (car rest)))
      (let ((update (car rest)))
        `(progn (%define-setf-expander
                 ',access
                 (lambda (place env)
                   (declare (ignore env))
                   (let ((temps (mapcar (lambda (a) (declare (ignore a)) (gensym "ARG")) (cdr place)))
                         (store (gensym "NEW")))
                     (values temps (cdr place) (list store)
                             (append (list ',update) temps (list store))
                             (cons ',access temps)))))
                ',access))
      (destructuring-bind (lambda-list stores &body body) rest
        (multiple-value-bind (decls forms) (%split-body body)
          (let ((env-var (cadr (member '&environment lambda-list)))
                (params (let ((tail (member '&environment lambda-list)))
                          (if tail (append (ldiff lambda-list tail) (cddr tail)) lambda-list))))
            `(progn (%define-setf-expander
                     ',access
                     (lambda (place ,(or env-var (gensym "ENV")))
                       (let ((temps (mapcar (lambda (a) (declare (ignore a)) (gensym "ARG")) (cdr place)))
                             (store-vars (mapcar (lambda (s) (declare (ignore s)) (gensym "NEW")) ',stores)))
                         (values temps (cdr place) store-vars
                                 (apply (lambda (,@stores ,@params) ,@(remove-if #'stringp decls) ,@forms)
                                        (append store-vars temps))
                                 (cons ',access temps)))))
                    ',access))))))

(defmacro define-setf-expander (access lambda-list &body body)
  ;; BODY returns the five values of get-setf-expansion for a place (ACCESS args...)
  (let ((env-var (or (cadr (member '&environment lambda-list)) (gensym "ENV")))
        (params (let ((tail (member '&environment lambda-list)))
                  (if tail (append (ldiff lambda-list tail) (cddr tail)) lambda-list)))
        (place (gensym "PLACE")))
    (multiple-value-bind (decls forms) (%split-body body)
      `(progn (%define-setf-expander
               ',access
               (lambda (,place ,env-var)
                 (declare (ignorable ,env-var))
                 (destructuring-bind ,params (cdr ,place) ,@(remove-if #'stringp decls) ,@forms)))
              ',access))))

(defun get-setf-expansion (place &optional env)
  (%place place env))

(defun (setf documentation) (new-value x doc-type)
  (%set-documentation x doc-type new-value))

;;; ------------------------------------------------------------------------------------------
;;; Iteration

(defmacro dolist ((var list &optional result) &body body)
  ;; endp, not consp: a list form that is not a proper list is a type-error
  (let ((tail (gensym "TAIL")) (top (gensym "TOP")) (end (gensym "END")))
    (multiple-value-bind (decls forms) (%split-body body)
      `(block nil
         (let ((,tail ,list))
           (tagbody
            ,top
              (when (endp ,tail) (go ,end))
              (let ((,var (car ,tail)))
                ,@decls
                (tagbody ,@forms))
              (setq ,tail (cdr ,tail))
              (go ,top)
            ,end)
           (let ((,var nil))
             (declare (ignorable ,var))
             ,result))))))

(defmacro dotimes ((var count &optional result) &body body)
  (let ((n (gensym "N")) (top (gensym "TOP")) (end (gensym "END")))
    (multiple-value-bind (decls forms) (%split-body body)
      `(block nil
         (let ((,n ,count) (,var 0))
           ,@decls
           (unless (integerp ,n)
             (error 'type-error :datum ,n :expected-type 'integer))
           (tagbody
            ,top
              (when (>= ,var ,n) (go ,end))
              (tagbody ,@forms)
              (setq ,var (1+ ,var))
              (go ,top)
            ,end)
           ,result)))))

(defun %do-expansion (let-form set-form specs end-clause body)
  (let ((top (gensym "TOP"))
        (steps (mapcan (lambda (spec)
                         (if (and (consp spec) (cdr (cdr spec)))
                             (list (car spec) (car (cdr (cdr spec))))
                             nil))
                       specs)))
    (multiple-value-bind (decls forms) (%split-body body)
      `(block nil
         (,let-form ,(mapcar (lambda (spec)
                               (if (consp spec) (list (car spec) (car (cdr spec))) spec))
                             specs)
           ,@decls
           (tagbody
            ,top
              (if ,(car end-clause) (return-from nil (progn ,@(cdr end-clause))))
              (tagbody ,@forms)
              (,set-form ,@steps)
              (go ,top)))))))

(defmacro do (specs end-clause &body body)
  (%do-expansion 'let 'psetq specs end-clause body))

(defmacro do* (specs end-clause &body body)
  (%do-expansion 'let* 'setq specs end-clause body))

;;; ------------------------------------------------------------------------------------------
;;; Macro-writing helpers

(defmacro with-gensyms (names &body body)
  `(let ,(mapcar (lambda (n)
                   (if (consp n)
                       `(,(car n) (gensym ,(car (cdr n))))
                       `(,n (gensym ,(symbol-name n)))))
                 names)
     ,@body))

(defmacro once-only (names &body body)
  ;; each NAME is evaluated once, in order, by the expansion the body produces
  (let ((temps (mapcar (lambda (n) (gensym (symbol-name n))) names)))
    `(let ,(mapcar (lambda (g) `(,g (gensym "ONCE"))) temps)
       (list 'let
             (list ,@(mapcar (lambda (g n) `(list ,g ,n)) temps names))
             (let ,(mapcar (lambda (n g) `(,n ,g)) names temps)
               ,@body)))))

;;; ------------------------------------------------------------------------------------------
;;; Places: setf and friends
;;;
;;; (%place place env) is get-setf-expansion: (values temps forms stores store-form access-form).
;;; The subforms of a place are evaluated once, left to right, before the new value.

(defun %direct-store (op)
  ;; the function that stores into (OP args...) when given the args and then the new value
  (let ((name (symbol-name op)))
    (cond ((member name '("CAR" "FIRST") :test #'string=) '%rplaca-value)
          ((member name '("CDR" "REST") :test #'string=) '%rplacd-value)
          ((string= name "NTH") '%set-nth)
          ((string= name "ELT") '%set-elt)
          ((string= name "AREF") '%aset)
          ((member name '("BIT" "SBIT") :test #'string=) '%set-bit)
          ((string= name "SVREF") '%svset)
          ((string= name "ROW-MAJOR-AREF") '%set-row-major-aref)
          ((string= name "GETHASH") '%puthash)
          ((string= name "SYMBOL-VALUE") 'set)
          ((string= name "SYMBOL-PLIST") '%set-symbol-plist)
          ((string= name "GET") '%put)
          ((string= name "FILL-POINTER") '%set-fill-pointer)
          ((string= name "SUBSEQ") '%set-subseq)
          ((member name '("SYMBOL-FUNCTION" "FDEFINITION") :test #'string=) '%set-symbol-function)
          ((member name '("CHAR" "SCHAR") :test #'string=) '%set-char)
          (t nil))))

(defun %nth-position (op)
  ;; 1 for second ... 9 for tenth
  (let ((entry (assoc (symbol-name op) '(("SECOND" . 1) ("THIRD" . 2) ("FOURTH" . 3) ("FIFTH" . 4)
                                         ("SIXTH" . 5) ("SEVENTH" . 6) ("EIGHTH" . 7) ("NINTH" . 8)
                                         ("TENTH" . 9))
                      :test #'string=)))
    (if entry (cdr entry) nil)))

(defun %cxr-path (op)
  ;; "AD" for CADR etc. (only for c[ad]{2,4}r), nil otherwise
  (let ((name (symbol-name op)))
    (if (and (> (length name) 3) (< (length name) 7)
             (string= (subseq name 0 1) "C")
             (string= (subseq name (1- (length name))) "R")
             (every (lambda (c) (or (char= c #\A) (char= c #\D)))
                    (subseq name 1 (1- (length name)))))
        (subseq name 1 (1- (length name)))
        nil)))

(defun %cxr-form (path form)
  (if (= (length path) 0)
      form
      (list (if (string= (subseq path 0 1) "A") 'car 'cdr)
            (%cxr-form (subseq path 1) form))))

(defun %normal-place (place)
  ;; PLACE as (op args...) with a direct store, if it is one in disguise (cadr, third ...)
  (let* ((op (car place)) (path (%cxr-path op)) (k (%nth-position op)))
    (cond (path (list (if (string= (subseq path 0 1) "A") 'car 'cdr) (%cxr-form (subseq path 1) (car (cdr place)))))
          (k (list 'nth k (car (cdr place))))
          (t place))))

(defun %constant-form-p (form)
  (or (and (atom form) (not (symbolp form))) (keywordp form) (null form) (eq form t)
      (and (consp form) (%name= (car form) "QUOTE"))))

(defun %place-temps (args)
  ;; temporaries for the subforms ARGS: (values temps forms places), a constant standing for itself
  (let ((temps nil) (forms nil) (refs nil))
    (dolist (a args)
      (if (%constant-form-p a)
          (push a refs)
          (let ((g (gensym "ARG")))
            (push g temps) (push a forms) (push g refs))))
    (values (reverse temps) (reverse forms) (reverse refs))))

(defun %place (place env)
  (cond
    ((symbolp place)
     (multiple-value-bind (expansion expanded) (macroexpand-1 place env)
       (if expanded
           (%place expansion env)
           (let ((store (gensym "NEW")))
             (values nil nil (list store) `(setq ,place ,store) place)))))
    ((not (consp place)) (error 'program-error :format-control "setf: ~s is not a place" :format-arguments (list place)))
    (t
     (let* ((place (if (symbolp (car place)) (%normal-place place) place))
            (op (car place)))
       (cond
         ((%name= op "GETF") (%getf-place place env))
         ((%name= op "VALUES") (%values-place place env))
         ((%name= op "THE") (%the-place place env))
         ((or (%name= op "LDB") (%name= op "MASK-FIELD")) (%byte-place place env))
         ((and (symbolp op) (not (%local-function-p op env)) (%setf-expander op))
          (funcall (%setf-expander op) place env))
         ((%direct-store op)
          (multiple-value-bind (temps forms refs) (%place-temps (cdr place))
            (let ((store (gensym "NEW")))
              (values temps forms (list store)
                      `(,(%direct-store op) ,@refs ,store)
                      `(,op ,@refs)))))
         (t
          (multiple-value-bind (expansion expanded) (macroexpand-1 place env)
            (if expanded
                (%place expansion env)
                (multiple-value-bind (temps forms refs) (%place-temps (cdr place))
                  (let ((store (gensym "NEW")))
                    (values temps forms (list store)
                            `(funcall (%setf-function ',op) ,store ,@refs)
                            `(,op ,@refs))))))))))))

(defun %getf-place (place env)
  ;; (getf inner indicator [default]): the plist place is read, changed and stored back
  (multiple-value-bind (temps forms stores store-form access) (%place (car (cdr place)) env)
    (let ((indicator (gensym "INDICATOR")) (default (gensym "DEFAULT")) (store (gensym "NEW")))
      (values (append temps (list indicator default))
              (append forms (list (car (cdr (cdr place))) (car (cdr (cdr (cdr place))))))
              (list store)
              `(let ((,(car stores) (%putf ,access ,indicator ,store)))
                 ,store-form
                 ,store)
              `(getf ,access ,indicator ,default)))))

(defun %values-place (place env)
  (let ((all-temps nil) (all-forms nil) (all-stores nil) (store-forms nil) (accesses nil))
    (dolist (p (cdr place))
      (multiple-value-bind (temps forms stores store-form access) (%place p env)
        (setq all-temps (append all-temps temps) all-forms (append all-forms forms))
        (push (car stores) all-stores)
        ;; a place with several stores, such as a nested (values b c), gets one value: its
        ;; first store takes it and the others are nil (CLHS 5.1.2.3)
        (push (if (cdr stores) `(let ,(mapcar #'list (cdr stores) (mapcar (constantly nil) (cdr stores))) ,store-form) store-form)
              store-forms)
        (push access accesses)))
    (values all-temps all-forms (reverse all-stores)
            `(progn ,@(reverse store-forms) (values ,@(reverse all-stores)))
            `(values ,@(reverse accesses)))))

(defun %byte-place (place env)
  ;; (ldb bytespec inner) and (mask-field bytespec inner): the integer place gets the new bits
  (multiple-value-bind (temps forms stores store-form access) (%place (car (cdr (cdr place))) env)
    (let ((spec (gensym "BYTESPEC")) (store (gensym "NEW")) (op (car place)))
      (values (cons spec temps) (cons (car (cdr place)) forms) (list store)
              `(let ((,(car stores) (,(if (%name= op "LDB") 'dpb 'deposit-field) ,store ,spec ,access)))
                 ,store-form
                 ,store)
              `(,op ,spec ,access)))))

(defun %the-place (place env)
  (multiple-value-bind (temps forms stores store-form access) (%place (car (cdr (cdr place))) env)
    (let ((type (car (cdr place))))
      (values temps forms stores
              `(let ((,(car stores) (the ,type ,(car stores)))) ,store-form)
              `(the ,type ,access)))))

(defun %place-let (temps forms body)
  (if temps `(let* ,(mapcar #'list temps forms) ,body) body))

(defun %store (stores value store-form)
  ;; bind the store variables to VALUE's values, then store
  (if (null (cdr stores))
      `(let ((,(car stores) ,value)) ,store-form)
      `(multiple-value-bind ,stores ,value ,store-form)))

(defun %setf-1 (place value env)
  (cond ((symbolp place)
         (multiple-value-bind (expansion expanded) (macroexpand-1 place env)
           (if expanded (%setf-1 expansion value env) `(setq ,place ,value))))
        ((and (consp place) (symbolp (car place)) (%direct-store (car (%normal-place place))))
         ;; the subforms and then the value are the store function's arguments, in order
         (let ((normal (%normal-place place)))
           `(,(%direct-store (car normal)) ,@(cdr normal) ,value)))
        (t
         (multiple-value-bind (temps forms stores store-form) (%place place env)
           (%place-let temps forms (%store stores value store-form))))))

(defmacro setf (&environment env &rest pairs)
  (when (oddp (length pairs))
    (error 'program-error :format-control "setf needs an even number of arguments: (setf place value ...)"))
  (if (and pairs (null (cdr (cdr pairs))))
      (%setf-1 (car pairs) (car (cdr pairs)) env)
      (let ((forms nil))
        (loop (when (null pairs) (return))
              (push (%setf-1 (car pairs) (car (cdr pairs)) env) forms)
              (setq pairs (cdr (cdr pairs))))
        `(progn ,@(reverse forms)))))

(defun %modify (place env make-value)
  ;; read-modify-write of PLACE: its subforms once; MAKE-VALUE turns the access form into the
  ;; new value's form
  (if (and (symbolp place) (not (nth-value 1 (macroexpand-1 place env))))
      `(setq ,place ,(funcall make-value place))
      (multiple-value-bind (temps forms stores store-form access) (%place place env)
        (%place-let temps forms (%store stores (funcall make-value access) store-form)))))

(defmacro incf (&environment env place &optional (delta 1))
  ;; the delta is evaluated before the place is read, as in SBCL
  (%modify place env (lambda (access) `(+ ,delta ,access))))

(defmacro decf (&environment env place &optional (delta 1))
  (let ((d (gensym "DELTA")))
    (%modify place env (lambda (access) `(let ((,d ,delta)) (- ,access ,d))))))

(defmacro push (&environment env item place)
  (if (symbolp place)
      `(setq ,place (cons ,item ,place))
      (let ((g (gensym "ITEM")))
        `(let ((,g ,item)) ,(%modify place env (lambda (access) `(cons ,g ,access)))))))

(defmacro pushnew (&environment env item place &rest keys)
  (let ((g (gensym "ITEM")))
    `(let ((,g ,item)) ,(%modify place env (lambda (access) `(adjoin ,g ,access ,@keys))))))

(defmacro pop (&environment env place)
  (multiple-value-bind (temps forms stores store-form access) (%place place env)
    (let ((g (gensym "HEAD")))
      (%place-let temps forms
                  `(let ((,g ,access))
                     (prog1 (car ,g) ,(%store stores `(cdr ,g) store-form)))))))

(defmacro remf (&environment env place indicator)
  ;; t when INDICATOR was there, nil otherwise
  (multiple-value-bind (temps forms stores store-form access) (%place place env)
    (let ((ind (gensym "INDICATOR")) (new (gensym "PLIST")) (found (gensym "FOUND")))
      (%place-let (append temps (list ind)) (append forms (list indicator))
                  `(multiple-value-bind (,new ,found) (%remf ,access ,ind)
                     ,(%store stores new store-form)
                     ,found)))))

(defmacro psetf (&environment env &rest pairs)
  ;; every place's subforms and every value first, left to right; then the stores
  (let ((bindings nil) (stores nil))
    (loop (when (null pairs) (return))
          (multiple-value-bind (temps forms store-vars store-form) (%place (car pairs) env)
            (setq bindings (append bindings (mapcar #'list temps forms)))
            (let ((g (gensym "VALUE")) (several (cdr store-vars)))
              ;; a place with several stores, (values a b), keeps all the values of its form
              (setq bindings (append bindings (list (list g (if several `(multiple-value-list ,(car (cdr pairs))) (car (cdr pairs)))))))
              (push (%store store-vars (if several `(values-list ,g) g) store-form) stores)))
          (setq pairs (cdr (cdr pairs))))
    `(let* ,bindings ,@(reverse stores) nil)))

(defun %shift-places (places env lists)
  ;; (values bindings accesses store-makers): each place read once, in order. With LISTS, each
  ;; value read is the list of all its values (for places with several stores: (values a b))
  (let ((bindings nil) (values-read nil) (makers nil))
    (dolist (p places)
      (multiple-value-bind (temps forms stores store-form access) (%place p env)
        (setq bindings (append bindings (mapcar #'list temps forms)))
        (let ((g (gensym "OLD")))
          (setq bindings (append bindings (list (list g (if lists `(multiple-value-list ,access) access)))))
          (push g values-read)
          (push (let ((s stores) (f store-form))
                  (lambda (value) (%store s (if lists `(values-list ,value) value) f)))
                makers))))
    (values bindings (reverse values-read) (reverse makers))))

(defun %some-place-stores-several (places env)
  (some (lambda (p) (cdr (nth-value 2 (%place p env)))) places))

(defmacro rotatef (&environment env &rest places)
  (if (null (cdr places))
      nil
      (multiple-value-bind (bindings olds makers) (%shift-places places env (%some-place-stores-several places env))
        `(let* ,bindings
           ,@(mapcar (lambda (maker value) (funcall maker value))
                     makers (append (cdr olds) (list (car olds))))
           nil))))

(defmacro shiftf (&environment env &rest places-and-value)
  (let* ((places (butlast places-and-value)) (value (car (last places-and-value)))
         (lists (%some-place-stores-several places env)))
    (multiple-value-bind (bindings olds makers) (%shift-places places env lists)
      (let ((new (gensym "NEW")))
        `(let* (,@bindings (,new ,(if lists `(multiple-value-list ,value) value)))
           ,@(mapcar (lambda (maker v) (funcall maker v)) makers (append (cdr olds) (list new)))
           ,(if lists `(values-list ,(car olds)) (car olds)))))))

(defmacro define-modify-macro (name lambda-list function &optional doc)
  (declare (ignore doc))
  (let* ((rest (cadr (member '&rest lambda-list)))
         (others (remove-if (lambda (p) (member p '(&optional &rest))) (ldiff lambda-list (member '&rest lambda-list))))
         (vars (mapcar (lambda (p) (if (consp p) (car p) p)) others))
         (place (gensym "PLACE"))
         (env (gensym "ENV")))
    `(defmacro ,name (&environment ,env ,place ,@lambda-list)
       (%modify ,place ,env (lambda (access) (list* ',function access ,@vars ,rest))))))

;;; ------------------------------------------------------------------------------------------
;;; Conditions

(defmacro ignore-errors (&body body)
  (let ((c (gensym "CONDITION")))
    `(handler-case (progn ,@body)
       (error (,c) (values nil ,c)))))

(defmacro assert (test &optional places datum &rest args)
  (declare (ignore places))
  (if datum
      `(unless ,test (error ,datum ,@args))
      `(unless ,test (error "The assertion ~s failed." ',test))))

(defmacro check-type (place type &optional type-string)
  ;; with a store-value restart that sets PLACE and checks again
  (let ((v (gensym "VALUE")))
    (%correctable
     place
     (lambda (wrap)
       `(let ((,v ,place))
          (unless (typep ,v ',type)
            ,(funcall wrap
                      `(error 'type-error
                              :format-control "The value of ~s is ~s, which is not ~a."
                              :format-arguments (list ',place ,v ,(or type-string (format nil "of type ~s" type)))
                              :datum ,v :expected-type ',type)))
          nil)))))

;;; ------------------------------------------------------------------------------------------
;;; Structures

;;; defstruct (CLHS 8.1): options :conc-name :constructor (any number, keyword or BOA)
;;; :copier :predicate :include (with slot overrides) :print-function :print-object :type
;;; (list or vector) :named :initial-offset; slot options :type and :read-only.

(defvar *%struct-layouts* (make-hash-table :test 'eq)
  "structure name -> (slot descriptions type named offset), for :include")

(defun %struct-option (options key)
  ;; the option (key args...) or key, as a list, or nil
  (find-if (lambda (o) (eq (car o) key)) options))

(defun %slot-description (spec)
  ;; (name initform read-only-p)
  (if (consp spec)
      (list (car spec) (cadr spec) (and (getf (cddr spec) :read-only) t))
      (list spec nil nil)))

(defun %include-slots (parent overrides)
  (multiple-value-bind (layout found) (gethash parent *%struct-layouts*)
    (unless found (error "defstruct: :include names ~s, which is not a structure" parent))
    (mapcar (lambda (slot)
              (let ((override (find (car slot) (mapcar #'%slot-description overrides) :key #'car)))
                (if override
                    (list (car slot) (cadr override) (or (caddr slot) (caddr override)))
                    slot)))
            (car layout))))

(defun %boa-lambda-list (lambda-list slots)
  ;; a BOA constructor's lambda list: &optional and &key slot variables without a default
  ;; default to the slot's initform
  (let ((section nil))
    (mapcar (lambda (p)
              (cond ((member p lambda-list-keywords) (setq section p) p)
                    ((and (member section '(&optional &key))
                          (let ((var (if (consp p) (car p) p)))
                            (and (symbolp var) (or (atom p) (null (cdr p))) (assoc var slots))))
                     (let ((var (if (consp p) (car p) p)))
                       (list var (cadr (assoc var slots)))))
                    (t p)))
            lambda-list)))

(defun %lambda-list-variables (lambda-list)
  (mapcan (lambda (p)
            (cond ((member p lambda-list-keywords) nil)
                  ((symbolp p) (list p))
                  ((and (consp p) (consp (car p))) (list (cadar p)))
                  ((consp p) (list (car p)))))
          lambda-list))

(defmacro defstruct (name-and-options &rest slot-specs)
  (let* ((name (if (consp name-and-options) (car name-and-options) name-and-options))
         (options (mapcar (lambda (o) (if (consp o) o (list o)))
                          (if (consp name-and-options) (cdr name-and-options) nil)))
         (conc-option (%struct-option options :conc-name))
         (prefix (cond ((null conc-option) (concatenate 'string (symbol-name name) "-"))
                       ((null (cadr conc-option)) "")
                       (t (string (cadr conc-option)))))
         (include-option (%struct-option options :include))
         (include (cadr include-option))
         (type-option (%struct-option options :type))
         (kind (let ((type (cadr type-option)))
                 (cond ((null type-option) nil)
                       ((eq type 'list) 'list)
                       (t 'vector))))
         (named (or (null kind) (and (%struct-option options :named) t)))
         (offset (if kind (or (cadr (%struct-option options :initial-offset)) 0) 0))
         (slots (append (if include (%include-slots include (cddr include-option)) nil)
                        (mapcar #'%slot-description (if (stringp (car slot-specs)) (cdr slot-specs) slot-specs))))
         (head (+ offset (if (and kind named) 1 0)))
         (constructors (let ((given (remove-if-not (lambda (o) (eq (car o) :constructor)) options)))
                         (cond ((null given) (list (list (intern (concatenate 'string "MAKE-" (symbol-name name))))))
                               (t (remove nil (mapcar (lambda (o)
                                                        (cond ((null (cdr o)) (list (intern (concatenate 'string "MAKE-" (symbol-name name)))))
                                                              ((null (cadr o)) nil)
                                                              (t (cdr o))))
                                                      given))))))
         (predicate-option (%struct-option options :predicate))
         (predicate (cond ((and kind (not named)) nil)
                          ((null predicate-option) (intern (concatenate 'string (symbol-name name) "-P")))
                          ((null (cdr predicate-option)) (intern (concatenate 'string (symbol-name name) "-P")))
                          (t (cadr predicate-option))))
         (copier-option (%struct-option options :copier))
         (copier (cond ((null copier-option) (intern (concatenate 'string "COPY-" (symbol-name name))))
                       ((null (cdr copier-option)) (intern (concatenate 'string "COPY-" (symbol-name name))))
                       (t (cadr copier-option))))
         (print-option (or (%struct-option options :print-function) (%struct-option options :print-object)))
         (obj (gensym "OBJ"))
         (value (gensym "VALUE"))
         (index (1- head)))
    (flet ((build (values)
             (let ((fields (append (make-list offset :initial-element (if (eq kind 'vector) 0 nil))
                                   (if (and kind named) (list `',name) nil) values)))
               (case kind
                 (list `(list ,@fields))
                 (vector `(vector ,@fields))
                 (t `(%make-struct ',name ,@values))))))
      `(progn
         ,@(if (null kind) `((%defstruct ',name ',(mapcar #'car slots) ',include)) nil)
         (setf (gethash ',name *%struct-layouts*) (list ',slots ',kind ',named ,offset))
         ,@(mapcar (lambda (c)
                     (if (cdr c)
                         (let* ((lambda-list (%boa-lambda-list (cadr c) slots))
                                (bound (%lambda-list-variables lambda-list)))
                           `(defun ,(car c) ,lambda-list
                              ,(build (mapcar (lambda (slot) (if (member (car slot) bound) (car slot) (cadr slot))) slots))))
                         `(defun ,(car c) (&key ,@(mapcar (lambda (slot) (list (car slot) (cadr slot))) slots))
                            ,(build (mapcar #'car slots)))))
                   constructors)
         ,@(when predicate
             `((defun ,predicate (,obj)
                 ,(case kind
                    (list `(and (consp ,obj) (eq (nth ,offset ,obj) ',name)))
                    (vector `(and (vectorp ,obj) (> (length ,obj) ,offset) (eq (aref ,obj ,offset) ',name)))
                    (t `(%struct-p ,obj ',name))))))
         ,@(when copier
             `((defun ,copier (,obj) ,(if (eq kind 'list) `(copy-list ,obj) (if kind `(copy-seq ,obj) `(copy-structure ,obj))))))
         ,@(mapcan (lambda (slot)
                     (setq index (1+ index))
                     (let ((accessor (intern (concatenate 'string prefix (symbol-name (car slot))))))
                       `((defun ,accessor (,obj)
                           ,(case kind
                              (list `(nth ,index ,obj))
                              (vector `(aref ,obj ,index))
                              (t `(%struct-ref ,obj ',name ,(- index head)))))
                         ,@(unless (caddr slot)
                             `((defun (setf ,accessor) (,value ,obj)
                                 ,(case kind
                                    (list `(setf (nth ,index ,obj) ,value))
                                    (vector `(setf (aref ,obj ,index) ,value))
                                    (t `(%struct-set ,obj ',name ,(- index head) ,value)))))))))
                   slots)
         ,@(when (and print-option (cdr print-option) (null kind))
             `((%set-struct-printer ',name
                                    ,(let ((f (cadr print-option))) (if (symbolp f) `',f `(function ,f)))
                                    ,(eq (car print-option) :print-object))))
         ',name))))

;;; ------------------------------------------------------------------------------------------
;;; Functions on functions, trees, declarations

(defmacro declaim (&rest specs)
  `(progn ,@(mapcar (lambda (spec) `(proclaim ',spec)) specs) nil))

(defun proclaim (spec)
  ;; special proclamations make the variables special; the others are advice
  (when (and (consp spec) (eq (car spec) 'special))
    (dolist (name (cdr spec)) (%declare-special name)))
  (values))

(defmacro define-symbol-macro (name expansion)
  `(progn (%define-symbol-macro ',name ',expansion) ',name))

(defun compile (name &optional (definition nil definition-p))
  ;; everything is already a function: compile returns it, with no warnings or failure
  (let ((fn (cond (definition-p (if (functionp definition) definition (coerce definition 'function)))
                  (t (fdefinition name)))))
    (when (and name definition-p) (setf (fdefinition name) fn))
    (values (or name fn) nil nil)))

(defun complement (fn)
  (lambda (&rest args) (not (apply fn args))))

(defun constantly (value)
  (lambda (&rest args) (declare (ignore args)) value))

;;; ------------------------------------------------------------------------------------------
;;; loop (CLHS 6.1): the clauses are parsed, and the expansion built, by %loop-expand
;;; (builtins_iteration.py, which lists the clauses and the expansion's shape).

(defmacro loop (&rest clauses)
  (if (every #'consp clauses)
      (let ((top (gensym "TOP")))
        `(block nil (tagbody ,top ,@clauses (go ,top))))
      (%loop-expand clauses)))

(defmacro loop-finish ()
  (error 'program-error :format-control "loop: loop-finish is only allowed inside a loop"))

;;; ------------------------------------------------------------------------------------------
;;; Conditions (handler-bind, restarts, define-condition) and string streams

;;; handler-bind: each handler is called where the condition is signalled (error, signal,
;;; warn, cerror), with only the handlers outside its handler-bind active; it declines by
;;; returning. An error a builtin signals reaches the handlers as it leaves the form.
(defmacro handler-bind (bindings &body body)
  `(%handler-bind (list ,@(mapcar (lambda (b) `(cons ',(car b) ,(cadr b))) bindings))
                  (lambda () ,@body)))

;;; Restarts (CLHS 9.1.4.2): a restart is a name and a function, active while its
;;; restart-bind or restart-case form runs.
(defstruct (restart (:print-object %print-restart))
  name function (test nil) (report nil) (interactive nil) (conditions nil))

(defun %print-restart (restart stream)
  ;; princ and ~a show the report (or the name, without one); prin1 shows which restart it is
  (cond (*print-escape* (format stream "#<restart ~s>" (restart-name restart)))
        ((restart-report restart) (funcall (restart-report restart) stream))
        (t (format stream "~s" (restart-name restart)))))

(defvar *%restarts* nil)

(defun %restart-options (options)
  ;; (:report-function f :test-function g ...) of restart-bind -> the args to make-restart
  (let ((test (getf options :test-function)) (report (getf options :report-function))
        (interactive (getf options :interactive-function)))
    `(,@(if test `(:test ,test) nil) ,@(if report `(:report ,report) nil)
      ,@(if interactive `(:interactive ,interactive) nil))))

(defmacro restart-bind (bindings &body body)
  `(let ((*%restarts*
           (list* ,@(mapcar (lambda (b) `(make-restart :name ',(car b) :function ,(cadr b) ,@(%restart-options (cddr b))))
                            bindings)
                  *%restarts*)))
     ,@body))

(defun %restart-clause (clause)
  ;; (name lambda-list [:report r] [:interactive i] [:test t] body...) -> (values options body)
  (let ((forms (cddr clause)) (options nil))
    (loop while (and forms (member (car forms) '(:report :interactive :test)))
          do (setq options (list* (car forms) (cadr forms) options) forms (cddr forms)))
    (values options forms)))

(defun %restart-report (report)
  (cond ((null report) nil)
        ((stringp report) `(lambda (stream) (write-string ,report stream)))
        ((symbolp report) `(function ,report))
        (t `(function ,report))))

(defun %restart-case-form (form env count)
  ;; CLHS 9.1.4.2.2: when FORM is a call to signal, error, cerror or warn, the restarts are
  ;; associated with the condition it signals
  (let* ((form (macroexpand form env))
         (op (and (consp form) (symbolp (car form)) (symbol-name (car form))))
         (default (cdr (assoc op '(("SIGNAL" . "SIMPLE-CONDITION") ("ERROR" . "SIMPLE-ERROR")
                                   ("CERROR" . "SIMPLE-ERROR") ("WARN" . "SIMPLE-WARNING"))
                              :test #'equal))))
    (if (null default)
        form
        (let ((c (gensym "CONDITION")) (control (gensym "CONTINUE")))
          (if (string= op "CERROR")
              `(let* ((,control ,(cadr form))
                      (,c (%coerce-condition ,(caddr form) (list ,@(cdddr form)) ,default)))
                 (with-condition-restarts ,c (subseq *%restarts* 0 ,count)
                   (cerror ,control ,c)))
              `(let ((,c (%coerce-condition ,(cadr form) (list ,@(cddr form)) ,default)))
                 (with-condition-restarts ,c (subseq *%restarts* 0 ,count)
                   (,(car form) ,c))))))))

(defmacro restart-case (&environment env form &rest clauses)
  (let ((block (gensym "RESTART-CASE")) (args (gensym "ARGS"))
        (tags (mapcar (lambda (c) (declare (ignore c)) (gensym "RESTART")) clauses)))
    `(block ,block
       (let ((,args nil))
         (tagbody
            (return-from ,block
              (restart-bind
                  ,(mapcar (lambda (c tag)
                             (let* ((options (%restart-clause c)) (test (getf options :test))
                                    (report (%restart-report (getf options :report)))
                                    (interactive (getf options :interactive)))
                               `(,(car c) (lambda (&rest a) (setq ,args a) (go ,tag))
                                 ,@(if test `(:test-function (function ,test)) nil)
                                 ,@(if report `(:report-function ,report) nil)
                                 ,@(if interactive `(:interactive-function (function ,interactive)) nil))))
                           clauses tags)
                ,(%restart-case-form form env (length clauses))))
            ,@(mapcan (lambda (c tag)
                        (multiple-value-bind (options body) (%restart-clause c)
                          (declare (ignore options))
                          `(,tag (return-from ,block (apply (lambda ,(cadr c) ,@body) ,args)))))
                      clauses tags))))))

(defun compute-restarts (&optional condition)
  ;; with a condition: the restarts associated with it or with no condition at all
  (remove-if-not (lambda (r) (and (or (null (restart-test r)) (funcall (restart-test r) condition))
                                  (or (null condition) (null (restart-conditions r))
                                      (member condition (restart-conditions r)))))
                 *%restarts*))

(defun find-restart (identifier &optional condition)
  (find-if (lambda (r) (if (restart-p identifier) (eq r identifier) (eq (restart-name r) identifier)))
           (compute-restarts condition)))

(defun invoke-restart (restart &rest arguments)
  (let ((r (find-restart restart)))
    (unless r
      (error 'control-error :format-control "No restart ~s is active." :format-arguments (list restart)))
    (apply (restart-function r) arguments)))

(defun invoke-restart-interactively (restart)
  ;; the arguments are what the restart's interactive function returns (none without one)
  (let ((r (find-restart restart)))
    (unless r
      (error 'control-error :format-control "No restart ~s is active." :format-arguments (list restart)))
    (apply (restart-function r) (if (restart-interactive r) (funcall (restart-interactive r)) nil))))

(defun abort (&optional condition)
  (invoke-restart (or (find-restart 'abort condition) 'abort)))

(defun muffle-warning (&optional condition)
  (invoke-restart (or (find-restart 'muffle-warning condition) 'muffle-warning)))

(defun continue (&optional condition)
  (let ((r (find-restart 'continue condition)))
    (when r (invoke-restart r))))

(defun use-value (value &optional condition)
  (let ((r (find-restart 'use-value condition)))
    (when r (invoke-restart r value))))

(defun store-value (value &optional condition)
  (let ((r (find-restart 'store-value condition)))
    (when r (invoke-restart r value))))

(defmacro with-simple-restart ((name format-control &rest args) &body forms)
  `(restart-case (progn ,@forms)
     (,name () :report (lambda (s) (format s ,format-control ,@args)) (values nil t))))

(defmacro with-condition-restarts (condition restarts &body body)
  ;; associates each restart with the condition while BODY runs
  (let ((c (gensym "CONDITION")) (rs (gensym "RESTARTS")) (r (gensym "RESTART")))
    `(let ((,c ,condition) (,rs ,restarts))
       (dolist (,r ,rs) (push ,c (restart-conditions ,r)))
       (unwind-protect (progn ,@body)
         (dolist (,r ,rs) (setf (restart-conditions ,r) (remove ,c (restart-conditions ,r) :count 1)))))))

(defun warn (datum &rest arguments)
  (let ((condition (%make-warning datum arguments)))
    (restart-case (progn (%signal condition) (%record-warning condition))
      (muffle-warning () nil))
    nil))

(defun cerror (continue-format-control datum &rest arguments)
  (declare (ignore continue-format-control))
  (restart-case (apply #'error datum arguments)
    (continue () nil))
  nil)

;;; define-condition: the type, its slots' initargs and initforms, and reader functions.
(defun %slot-spec (spec)
  (let* ((spec (if (consp spec) spec (list spec))) (options (cdr spec)) (initargs nil) (initform nil))
    (loop for (key value) on options by #'cddr
          do (cond ((eq key :initarg) (push value initargs))
                   ((eq key :initform) (setq initform `(lambda () ,value)))))
    `(list ',(car spec) ',(reverse initargs) ,initform)))

(defun %slot-readers (spec)
  (let* ((spec (if (consp spec) spec (list spec))) (slot (car spec)) (out nil))
    (loop for (key value) on (cdr spec) by #'cddr
          do (cond ((eq key :reader)
                    (push `(defun ,value (c) (%condition-slot c ',slot)) out))
                   ((eq key :accessor)
                    (push `(defun ,value (c) (%condition-slot c ',slot)) out)
                    (push `(defun (setf ,value) (v c) (%set-condition-slot c ',slot v)) out))))
    (reverse out)))

(defmacro define-condition (name parents slots &rest options)
  (let ((report (cadr (assoc :report options))))
    `(progn
       (%define-condition ',name ',parents (list ,@(mapcar #'%slot-spec slots))
                          ,(cond ((null report) nil) ((stringp report) report) (t (%restart-report report))))
       ,@(mapcan #'%slot-readers slots)
       ',name)))

;;; String streams
(defmacro with-standard-io-syntax (&body body)
  ;; the standard values of CLHS's table for the printer and reader variables; floats read as
  ;; doubles, the only floats there are
  `(let ((*print-array* t) (*print-base* 10) (*print-case* :upcase) (*print-circle* nil)
         (*print-escape* t) (*print-gensym* t) (*print-length* nil) (*print-level* nil)
         (*print-lines* nil) (*print-miser-width* nil) (*print-pretty* nil) (*print-radix* nil)
         (*print-readably* t) (*print-right-margin* nil) (*read-base* 10)
         (*read-default-float-format* 'double-float) (*read-eval* t) (*read-suppress* nil))
     ,@body))

(defmacro with-output-to-string ((var &optional string &key element-type) &body body)
  (declare (ignore string element-type))
  `(let ((,var (make-string-output-stream)))
     ,@body
     (get-output-stream-string ,var)))

;;; formatter (CLHS 22.4): a function of a stream and the arguments that formats them with the
;;; control string and returns the arguments it did not consume; format takes it as its control
(defmacro formatter (control-string)
  (let ((stream (gensym "STREAM")) (args (gensym "ARGS")))
    `(lambda (,stream &rest ,args)
       (%formatter-run ,stream ,(%formatter-check control-string) ,args))))

(defmacro with-input-from-string ((var string &key index (start 0) end) &body body)
  `(let ((,var (make-string-input-stream ,string ,start ,end)))
     (multiple-value-prog1 (progn ,@body)
       ,@(if index `((setf ,index (%stream-position ,var))) nil))))

(defmacro with-open-stream ((var stream) &body body)
  `(let ((,var ,stream)) ,@body))
